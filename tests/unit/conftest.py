"""Shared fixtures for the pure-code unit tests: no Slurm, no database, no network."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.templates import Template, load_templates

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_TEMPLATES = REPO_ROOT / "slurm_templates"


@pytest.fixture(scope="session")
def shipped_templates() -> dict[str, Template]:
    """The templates in the repository's slurm_templates/, loaded once."""
    return load_templates(SHIPPED_TEMPLATES)


@pytest.fixture(scope="session")
def hello(shipped_templates: dict[str, Template]) -> Template:
    return shipped_templates["hello"]
