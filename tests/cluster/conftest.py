"""Fixtures for the tests of the local Slurm cluster that `make cluster` provisions."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
