"""Concurrent submits against one prepaid credit, through gunicorn with 4 workers on PostgreSQL."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from billing.prices import set_price
from gpupool import db
from gpupool.clock import FrozenClock
from gpupool.models import Account, Job, Price
from gpupool.slurm.client import SlurmClient
from tests.conftest import (
    SUITE_NOW,
    add_account_row,
    base_settings,
    recorded_token,
    slurm_cmd,
    throwaway_slurm_account,
    utc,
)
from tests.live.conftest import Server, http

SUBMITS = 20
FITS = 5
PRICE_NANOS = 100_000  # per GPU-second
JOB = {"template": "hello", "gpus": 1, "gpu_type": "rtx4090", "time_limit_min": 10, "params": {"message": "race"}}
WORST_CASE_NANOS = 1 * 10 * 60 * PRICE_NANOS


@pytest.fixture
def budgeted_account(live_db: str, slurm: SlurmClient) -> Iterator[tuple[str, str]]:
    """(account, database URL): a credit of exactly FITS worst cases; Slurm's GPU limit of 0 keeps its jobs pending."""
    url = f"postgresql://postgres@127.0.0.1:5432/{live_db}"
    with throwaway_slurm_account(slurm, "r", gpu_limit=0) as name:
        engine = db.make_engine(url)
        factory = db.make_session_factory(engine)
        add_account_row(factory, name)
        with factory() as session, session.begin():
            session.get_one(Account, name).prepaid_credit_nanos = FITS * WORST_CASE_NANOS
            if session.scalar(select(Price.id).where(Price.gpu_type == "rtx4090")) is None:  # the database is the module's
                set_price(session, "rtx4090", PRICE_NANOS, utc("2020-01-01T00:00:00Z"))
        engine.dispose()
        yield name, url


def test_concurrent_submits_never_spend_past_the_credit(
    start_server: Callable[..., Server], budgeted_account: tuple[str, str]
) -> None:
    account, url = budgeted_account
    server = start_server()
    token = recorded_token(base_settings(database_url=url), account, sub=f"racer-{secrets.token_hex(4)}")
    start = threading.Barrier(SUBMITS)
    statuses: list[int] = []
    lock = threading.Lock()

    def submit() -> None:
        start.wait()
        reply = http("POST", server.url + "/submit", token=token, body=JOB, timeout_s=60)
        with lock:
            statuses.append(reply.status)

    threads = [threading.Thread(target=submit) for _ in range(SUBMITS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    accepted = statuses.count(201)
    assert 1 <= accepted <= FITS, statuses
    assert statuses.count(402) == SUBMITS - accepted, statuses
    queued = slurm_cmd("squeue", "-h", f"--account={account}", "-o", "%i").split()
    assert len(queued) == accepted
    engine = db.make_engine(url)
    with db.make_session_factory(engine)() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(Job.account == account)) == accepted
    engine.dispose()
    # The budget is spent on worst cases: one more is refused, saying so.
    refused = http("POST", server.url + "/submit", token=token, body=JOB)
    assert refused.status == 402 and refused.body["error"] == "payment_required"


def test_concurrent_submits_on_sqlite_take_the_write_lock_first(
    tmp_path: Path, slurm: SlurmClient, job_root: Path, runas_socket: str
) -> None:
    from api import create_app

    url = f"sqlite:///{tmp_path}/gpupool.db"
    engine = db.make_engine(url)
    db.upgrade(engine)
    fits = 2
    with throwaway_slurm_account(slurm, "q", gpu_limit=0) as account:
        factory = db.make_session_factory(engine)
        add_account_row(factory, account)
        with factory() as session, session.begin():
            session.get_one(Account, account).prepaid_credit_nanos = fits * WORST_CASE_NANOS
            set_price(session, "rtx4090", PRICE_NANOS, utc("2020-01-01T00:00:00Z"))
        settings = base_settings(database_url=url, job_root=str(job_root), runas_socket=runas_socket)
        app = create_app(settings, clock=FrozenClock(SUITE_NOW))
        headers = {"Authorization": "Bearer " + recorded_token(settings, account, sub="racer")}
        start = threading.Barrier(8)
        statuses: list[int] = []

        def submit() -> None:
            start.wait()
            status = app.test_client().post("/submit", headers=headers, json=JOB).status_code
            statuses.append(status)  # list.append is atomic

        threads = [threading.Thread(target=submit) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(statuses) == [201] * fits + [402] * (8 - fits)
        assert len(slurm_cmd("squeue", "-h", f"--account={account}", "-o", "%i").split()) == fits
    engine.dispose()
