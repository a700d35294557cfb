"""Fixtures for the tests of the playbook (deploy/ansible) and the local cluster it provisions."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ansible: runs ansible-playbook or ansible-lint on this machine, without the cluster")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
