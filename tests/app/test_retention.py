"""Which job folders the retention removes: finished jobs over for longer than the setting, whose folder is still there.

On the migrated SQLite schema, with job folders in a temporary job root and a
recording stand-in for the run-as helper's ``discard`` (the real one, as root
through the helper, is tests/live/test_job_outputs.py).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy.orm import sessionmaker

from gpupool.errors import TenantError
from gpupool.models import Job
from gpupool.retention import prune_job_folders
from tests.app.conftest import ACCOUNT
from tests.conftest import base_settings

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


class Discards:
    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.calls: list[tuple[str, str]] = []
        self.failing = failing

    def discard(self, account: str, job_id: str) -> None:
        if job_id in self.failing:
            raise TenantError("the helper refused")
        self.calls.append((account, job_id))


def job_id(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


@pytest.fixture
def jobs(session_factory: sessionmaker, tmp_path: Path) -> Path:
    """Jobs 1-5 with folders, and job 6 without: ended 10, 3, 20 days ago, unfinished, never ran; 6 ended 10 days ago."""
    root = tmp_path / "jobs"
    ended = {1: NOW - dt.timedelta(days=10), 2: NOW - dt.timedelta(days=3), 3: NOW - dt.timedelta(days=20), 4: None, 5: None, 6: NOW - dt.timedelta(days=10)}
    with session_factory() as session, session.begin():
        for n, end in ended.items():
            if n != 6:
                (root / ACCOUNT / job_id(n) / "output").mkdir(parents=True)
            session.add(Job(
                id=job_id(n), account=ACCOUNT, owner="alice", name="j", template="hello", params={}, gpus=1, cpus=1, mem_gb=1,
                time_limit_min=1, job_dir=str(root / ACCOUNT / job_id(n)), state="RUNNING" if n == 4 else "COMPLETED",
                finished=n != 4, ended_at=end, request_hash="0" * 64, created_at=NOW - dt.timedelta(days=30),
                updated_at=NOW - dt.timedelta(days=9) if n == 5 else NOW,
            ))
    return root


def test_only_finished_jobs_past_the_retention_with_a_folder_are_removed(session_factory: sessionmaker, jobs: Path) -> None:
    settings = base_settings(job_root=str(jobs), job_output_retention_days=7)
    helper = Discards()
    pruned = prune_job_folders(session_factory, settings, helper, NOW)
    # Job 3 ended before the timer's lookback; 5 never ran, its row last changed 9 days ago.
    assert sorted(pruned.removed) == [job_id(1), job_id(5)] and sorted(helper.calls) == [(ACCOUNT, job_id(1)), (ACCOUNT, job_id(5))]
    everything = Discards()
    assert sorted(prune_job_folders(session_factory, settings, everything, NOW, lookback=None).removed) == [job_id(1), job_id(3), job_id(5)]


def test_zero_keeps_everything_and_a_dry_run_removes_nothing(session_factory: sessionmaker, jobs: Path) -> None:
    helper = Discards()
    assert prune_job_folders(session_factory, base_settings(job_root=str(jobs), job_output_retention_days=0), helper, NOW).removed == []
    settings = base_settings(job_root=str(jobs), job_output_retention_days=1)
    told = prune_job_folders(session_factory, settings, helper, NOW, lookback=None, dry_run=True)
    assert sorted(told.removed) == [job_id(1), job_id(2), job_id(3), job_id(5)] and helper.calls == []


def test_a_refusal_is_reported_and_the_rest_go_on(session_factory: sessionmaker, jobs: Path) -> None:
    helper = Discards(failing=frozenset({job_id(1)}))
    pruned = prune_job_folders(session_factory, base_settings(job_root=str(jobs), job_output_retention_days=7), helper, NOW)
    assert pruned.failed == {job_id(1): "the helper refused"} and pruned.removed == [job_id(5)]
