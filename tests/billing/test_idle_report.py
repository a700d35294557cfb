"""Idle GPU-hours on a real database (PostgreSQL and SQLite): the idle check's upsert keeps the larger count, and
the report sums the hours that start in its window by account and template."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from billing.report.idle import idle_figures, idle_rows
from gpupool.gpu_usage.idle_time import recount, store_idle_hours
from gpupool.gpu_usage.samples import Reading
from gpupool.models import IdleGpuHour, Job
from tests.billing.conftest import LedgerDb

H = dt.datetime(2026, 11, 2, 10, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


def add_job(ledger: LedgerDb, job_id: str, account: str, template: str) -> None:
    now = dt.datetime.now(dt.UTC)
    with ledger.sessions() as session, session.begin():
        session.add(
            Job(
                id=job_id, account=account, owner="alice", name="j", template=template, params={}, gpus=2, cpus=1,
                mem_gb=1, time_limit_min=60, job_dir="/nonexistent", state="RUNNING", finished=False,
                request_hash="0" * 64, created_at=now, updated_at=now,
            )
        )


def store(ledger: LedgerDb, job_id: str, hours: dict[dt.datetime, float]) -> None:
    with ledger.sessions() as session, session.begin():
        store_idle_hours(session, job_id, hours)


def stored(ledger: LedgerDb) -> dict[tuple[str, dt.datetime], float]:
    with ledger.sessions() as session:
        return {(row.job_id, row.hour): row.idle_gpu_seconds for row in session.scalars(select(IdleGpuHour))}


def test_the_upsert_keeps_the_larger_count_and_a_rerun_adds_nothing(ledger_db: LedgerDb) -> None:
    ledger_db.add_account("acme")
    add_job(ledger_db, "00000000-0000-4000-8000-0000000000a1", "acme", "train")
    job = "00000000-0000-4000-8000-0000000000a1"
    samples = {("vm", 0): [Reading(H + dt.timedelta(minutes=m), 0.0) for m in range(4)]}
    first = recount(samples, 5, H + dt.timedelta(minutes=3))
    assert first == {H: 180.0}
    store(ledger_db, job, first)
    store(ledger_db, job, first)  # the same pass again
    assert stored(ledger_db) == {(job, H): 180.0}
    # A pass that saw fewer samples (pruned, or the exporter down) lowers nothing; one that saw more raises it.
    store(ledger_db, job, {H: 60.0})
    assert stored(ledger_db) == {(job, H): 180.0}
    store(ledger_db, job, {H: 240.0, H + HOUR: 30.0})
    assert stored(ledger_db) == {(job, H): 240.0, (job, H + HOUR): 30.0}


def test_the_report_sums_the_hours_that_start_in_its_window_by_account_and_template(ledger_db: LedgerDb) -> None:
    for account in ("acme", "beta"):
        ledger_db.add_account(account)
    jobs = {
        "00000000-0000-4000-8000-0000000000b1": ("acme", "train"),
        "00000000-0000-4000-8000-0000000000b2": ("acme", "jupyter"),
        "00000000-0000-4000-8000-0000000000b3": ("beta", "train"),
    }
    for job_id, (account, template) in jobs.items():
        add_job(ledger_db, job_id, account, template)
    b1, b2, b3 = jobs
    store(ledger_db, b1, {H - HOUR: 1000.0, H: 1800.0, H + HOUR: 30.5})
    store(ledger_db, b2, {H + HOUR: 569.5, H + 2 * HOUR: 7000.0})
    store(ledger_db, b3, {H + HOUR: 3600.0})
    with ledger_db.sessions() as session:
        rows = idle_rows(session, H, H + 2 * HOUR)  # 10:00 and 11:00; not 09:00, nor 12:00 (the window's end)
    assert rows == [("acme", "jupyter", 569.5), ("acme", "train", 1830.5), ("beta", "train", 3600.0)]
    figures = idle_figures(rows, gpu_seconds_sold=24_000)
    assert (figures["gpu_seconds"], figures["gpu_hours"], figures["share_of_gpu_hours_sold"]) == (6000, "1.67", "0.2500")
    assert figures["by_account"] == [
        {"account": "acme", "gpu_seconds": 2400, "gpu_hours": "0.67"},
        {"account": "beta", "gpu_seconds": 3600, "gpu_hours": "1.00"},
    ]
    assert figures["by_template"] == [
        {"template": "jupyter", "gpu_seconds": 570, "gpu_hours": "0.16"},
        {"template": "train", "gpu_seconds": 5431, "gpu_hours": "1.51"},
    ]
