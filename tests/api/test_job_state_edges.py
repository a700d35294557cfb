"""Job states at the edges: a refresh lease from a clock that runs ahead, jobs Slurm never reports again."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from billing.prices import set_price
from gpupool import db
from gpupool.config import Settings
from gpupool.jobstate import LEASE_ID, JobStateRefresher
from gpupool.models import Account, Job, SlurmSync
from gpupool.slurm.client import SlurmClient
from tests.conftest import bearer, new_uuid

INTERVAL_S = 60.0


@pytest.fixture(params=["postgresql", "sqlite"])
def lease_sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker]:
    """A database with no unfinished jobs, so a refresh reads the lease and nothing else."""
    if request.param == "postgresql":
        yield request.getfixturevalue("session_factory")
        return
    engine = db.make_engine(f"sqlite:///{tmp_path}/lease.db")
    db.upgrade(engine)
    yield db.make_session_factory(engine)
    engine.dispose()


def lease_started_at(sessions: sessionmaker) -> dt.datetime:
    with sessions() as session:
        started_at = session.scalar(select(SlurmSync.started_at).where(SlurmSync.id == LEASE_ID))
    assert started_at is not None
    return started_at


def database_clock(sessions: sessionmaker) -> dt.datetime:
    with sessions() as session:
        now = session.scalar(select(db.database_now()))
    assert now is not None
    return now


def test_a_lease_taken_by_a_clock_running_an_hour_ahead_does_not_hold_the_refresh(
    lease_sessions: sessionmaker, slurm: SlurmClient
) -> None:
    # What a host whose clock runs an hour ahead left behind: a lease that seems to start in the future.
    with lease_sessions() as session, session.begin():
        session.merge(SlurmSync(id=LEASE_ID, started_at=db.utcnow() + dt.timedelta(hours=1)))

    refresher = JobStateRefresher(lease_sessions, slurm, interval_s=INTERVAL_S, submission_grace_s=60)
    assert refresher.maybe_refresh() is True
    # The lease now runs on the database's clock, and holds for one interval from there.
    assert lease_started_at(lease_sessions) <= database_clock(lease_sessions)
    another_worker = JobStateRefresher(lease_sessions, slurm, interval_s=INTERVAL_S, submission_grace_s=60)
    assert another_worker.maybe_refresh() is False


def test_a_lease_is_taken_and_released_on_the_database_clock(lease_sessions: sessionmaker, slurm: SlurmClient) -> None:
    refresher = JobStateRefresher(lease_sessions, slurm, interval_s=INTERVAL_S, submission_grace_s=60)
    assert refresher.maybe_refresh() is True  # creates the lease row
    # An interval ago by the database's clock, whatever the caller's says: free to take.
    with lease_sessions() as session, session.begin():
        session.merge(SlurmSync(id=LEASE_ID, started_at=database_clock(lease_sessions) - dt.timedelta(seconds=INTERVAL_S + 1)))
    second = JobStateRefresher(lease_sessions, slurm, interval_s=INTERVAL_S, submission_grace_s=60)
    assert second.maybe_refresh() is True
    assert JobStateRefresher(lease_sessions, slurm, interval_s=INTERVAL_S, submission_grace_s=60).maybe_refresh() is False


# Far past any job id this cluster hands out: squeue and sacct both answer "no such job".
NEVER_REPORTED_SLURM_ID = 60_000_000
EIGHT_DAYS = dt.timedelta(days=8)


def forgotten_job(session_factory: sessionmaker, account: str, *, gpus: int, age: dt.timedelta, **columns: object) -> str:
    """The row of a job Slurm last answered for ``age`` ago: sacct purged it, or slurmdbd never got it."""
    job_id = new_uuid()
    then = db.utcnow() - age
    with session_factory() as session, session.begin():
        session.add(
            Job(
                id=job_id, account=account, owner="alice", name="forgotten", template="hello", params={}, gpus=gpus,
                gpu_type=None, cpus=1, mem_gb=4, time_limit_min=60, job_dir=f"/nonexistent/{job_id}", request_hash="0" * 64,
                slurm_job_id=NEVER_REPORTED_SLURM_ID, state="PENDING", finished=False, submitted_at=then,
                submit_attempted_at=then, created_at=then, updated_at=then, **columns,
            )
        )
    return job_id


def test_a_job_slurm_stopped_reporting_long_ago_becomes_unknown_and_frees_the_budget(
    client: FlaskClient, settings: Settings, account: str, session_factory: sessionmaker, caplog: pytest.LogCaptureFixture
) -> None:
    with session_factory() as session, session.begin():
        set_price(session, "rtx4090", 120_000, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        session.get(Account, account).prepaid_credit_nanos = 2_000_000_000  # type: ignore[union-attr]
    # Its worst case, 4 GPUs x 60 min x 0.00012 = 1.728, leaves 0.272 of 2.00: too little for a 1-GPU hour (0.432).
    stuck = forgotten_job(session_factory, account, gpus=4, age=EIGHT_DAYS)
    headers = bearer(settings, account)
    one_gpu_hour = {"template": "hello", "gpus": 1, "time_limit_min": 60, "params": {"seconds": 0}}
    assert client.post("/submit", headers=headers, json=one_gpu_hour).status_code == 402

    with caplog.at_level(logging.WARNING, logger="gpupool.jobstate"):
        seen = client.get(f"/jobs/{stuck}", headers=headers).get_json()
    assert (seen["state"], seen["reason"], seen["exit_code"]) == ("UNKNOWN", "NotReportedBySlurm", None)
    assert any(stuck in record.getMessage() and str(NEVER_REPORTED_SLURM_ID) in record.getMessage() for record in caplog.records)
    with session_factory() as session:
        assert session.get(Job, stuck).finished is True  # type: ignore[union-attr]

    submitted = client.post("/submit", headers=headers, json=one_gpu_hour)
    assert submitted.status_code == 201, submitted.get_json()
    admin = bearer(settings, account, sub="ops", role="admin")
    listed = client.get("/jobs?state=UNKNOWN", headers=admin).get_json()["jobs"]
    assert [(job["job_id"], job["account"]) for job in listed] == [(stuck, account)]
    assert client.delete(f"/jobs/{stuck}", headers=headers).get_json()["error"] == "job_finished"


def test_a_job_slurm_answered_for_recently_is_kept_and_asked_about_again(
    client: FlaskClient, settings: Settings, account: str, session_factory: sessionmaker
) -> None:
    recently = forgotten_job(session_factory, account, gpus=1, age=EIGHT_DAYS, last_seen_at=db.utcnow() - dt.timedelta(hours=1))
    body = client.get(f"/jobs/{recently}", headers=bearer(settings, account)).get_json()
    assert (body["state"], body["reason"]) == ("PENDING", None)
    with session_factory() as session:
        assert session.get(Job, recently).finished is False  # type: ignore[union-attr]
