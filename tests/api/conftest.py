from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from tests.conftest import REPO, add_account_row, cancel_account_jobs, throwaway_slurm_account

# Extra templates only the tests use: they expose what a job sees.
TEST_TEMPLATES = {
    "envdump": ('description = "Print the job environment."\n', "env | sort\n"),
    "fail": ('description = "Exit with status 3."\n', "echo failing >&2\nexit 3\n"),
}


@pytest.fixture(scope="session")
def templates_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("templates")
    for shipped in (REPO / "slurm_templates").iterdir():
        shutil.copytree(shipped, root / shipped.name)
    for name, (spec, body) in TEST_TEMPLATES.items():
        (root / name).mkdir()
        (root / name / "template.toml").write_text(spec)
        (root / name / "run.sh").write_text(body)
    return root


@pytest.fixture
def settings(session_settings: Settings, templates_dir: Path) -> Settings:
    return session_settings.replace(templates_dir=str(templates_dir))


@pytest.fixture(scope="session")
def other_slurm_account(slurm: SlurmClient) -> Iterator[str]:
    with throwaway_slurm_account(slurm, "o") as name:
        yield name


@pytest.fixture
def other_account(session_factory: sessionmaker, other_slurm_account: str) -> Iterator[str]:
    add_account_row(session_factory, other_slurm_account)
    yield other_slurm_account
    cancel_account_jobs(other_slurm_account)
