"""Start estimates and quotes on the real cluster: Slurm's own backfill estimate, and dry runs that create nothing."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from billing.prices import set_price
from gpupool.config import Settings
from gpupool.models import Account, Job
from gpupool.slurm.client import SlurmClient
from tests.conftest import add_account_row, bearer, slurm_cmd, throwaway_slurm_account, utc, wait_for, wait_for_state


def slurm_jobs_of(account: str, since: dt.datetime) -> tuple[str, str]:
    """Every job Slurm has of ``account``: squeue's (any state) and sacct's since ``since``."""
    queued = slurm_cmd("squeue", "-h", f"--account={account}", "--states=all", "-o", "%i")
    recorded = slurm_cmd("sacct", "-n", "-X", f"--accounts={account}", f"--starttime={since:%Y-%m-%dT%H:%M:%S}", "-o", "JobID")
    return queued.strip(), recorded.strip()


@pytest.fixture
def fresh_account(slurm: SlurmClient, session_factory: sessionmaker) -> Iterator[str]:
    """An account no other test has submitted under: whatever Slurm lists for it, this test made."""
    with throwaway_slurm_account(slurm, "q") as name:
        add_account_row(session_factory, name)
        yield name


def test_a_dry_run_creates_nothing_and_quotes_the_402_checks_worst_case(
    client: FlaskClient, settings: Settings, fresh_account: str, session_factory: sessionmaker
) -> None:
    account = fresh_account
    headers = bearer(settings, account)
    since = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=1)
    with session_factory() as session, session.begin():
        set_price(session, "rtx4090", 120_000, utc("2020-01-01T00:00:00Z"))
        session.get(Account, account).prepaid_credit_nanos = 1_000_000_000  # type: ignore[union-attr]
    big = {"template": "hello", "gpus": 4, "gpu_type": "rtx4090", "time_limit_min": 60}
    refused = client.post("/submit?dry_run=true", headers=headers, json=big)
    # 4 GPUs x 60 min x 0.00012 = 1.728 > 1.00: refused as the submit itself is.
    assert refused.status_code == 402, refused.get_json()
    assert refused.get_json() == client.post("/submit", headers=headers, json=big).get_json()
    required = refused.get_json()["required"]
    assert required == "1.728"

    with session_factory() as session, session.begin():
        session.get(Account, account).prepaid_credit_nanos = 10_000_000_000  # type: ignore[union-attr]
    answer = client.post("/submit?dry_run=true", headers=headers, json=big)
    assert answer.status_code == 200, answer.get_json()
    body = answer.get_json()
    assert body["dry_run"] is True and body["would_be_admitted"] is True
    assert body["quote"] == {
        "gpus": 4, "gpu_type": "rtx4090", "time_limit_min": 60, "gpu_seconds_worst_case": 4 * 3600,
        "price_per_gpu_second": "0.00012", "worst_case_cost": required, "currency": settings.currency,
    }
    # sbatch --test-only's estimate: a time, whatever else the shared cluster is running.
    assert isinstance(body["estimated_start"], str) and utc(body["estimated_start"]) >= since
    alias = client.post("/quote", headers=headers, json=big)
    assert alias.status_code == 200
    assert alias.get_json()["quote"] == body["quote"]
    # What a submit refuses before Slurm, a dry run refuses the same way.
    too_many = client.post("/quote", headers=headers, json={**big, "gpus": 64})
    assert too_many.status_code == 422
    assert too_many.get_json() == client.post("/submit", headers=headers, json={**big, "gpus": 64}).get_json()
    assert client.post("/submit?dry_run=maybe", headers=headers, json=big).status_code == 400
    # A session template renders its session options too, and quotes without a session row or secret.
    session_quote = client.post("/quote", headers=headers, json={"template": "webapp", "gpus": 1, "params": {"command": "true"}})
    assert session_quote.status_code == 200, session_quote.get_json()

    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(Job.account == account)) == 0
    assert slurm_jobs_of(account, since) == ("", "")


def test_a_pending_job_behind_a_running_one_gets_slurms_backfill_estimate(
    client: FlaskClient, settings: Settings, account: str, other_account: str
) -> None:
    ahead_headers, headers = bearer(settings, other_account), bearer(settings, account)
    # One GPU held for at most 2 minutes by another account; then a job wanting all four waits on Resources.
    ahead = client.post(
        "/submit", headers=ahead_headers, json={"template": "hello", "gpus": 1, "time_limit_min": 2, "params": {"seconds": 120}}
    ).get_json()
    wait_for_state(client, ahead["job_id"], ahead_headers, {"RUNNING"}, timeout_s=120)
    behind = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 4, "time_limit_min": 1}).get_json()
    try:
        def estimated() -> dict | None:
            view = client.get(f"/jobs/{behind['job_id']}", headers=headers).get_json()
            return view if view["state"] != "PENDING" or view["estimated_start"] is not None else None

        # The backfill pass sets it within its interval (bf_interval, 30 s by default).
        view = wait_for(estimated, timeout_s=90, what="backfill's estimate for the pending job")
        assert view["state"] == "PENDING", view
        start = slurm_cmd("squeue", "--start", "-h", f"--jobs={behind['slurm_job_id']}", "-o", "%S").strip()
        assert utc(view["estimated_start"]) == utc(start + "Z")
        assert view["queue_position"] == 1
        assert "estimated_start" in client.get("/jobs", headers=headers).get_json()["jobs"][0]
    finally:
        for job, who in ((behind, headers), (ahead, ahead_headers)):
            client.delete(f"/jobs/{job['job_id']}", headers=who)
    ended = wait_for_state(client, ahead["job_id"], ahead_headers, {"CANCELLED"}, timeout_s=60)
    assert ended["estimated_start"] is None


def test_queue_position_counts_pending_jobs_of_the_same_type_in_slurms_expected_order(
    client: FlaskClient, settings: Settings, account: str, other_account: str, session_factory: sessionmaker
) -> None:
    """Rows as the refresher leaves them (no Slurm job behind them: nothing here asks Slurm to run anything)."""
    soon = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    created = soon - dt.timedelta(hours=2)
    rows = {
        # name: (account, gpu_type, expected start, created)
        "later": (account, "rtx4090", soon + dt.timedelta(minutes=10), created + dt.timedelta(seconds=1)),
        "sooner": (other_account, "rtx4090", soon + dt.timedelta(minutes=5), created + dt.timedelta(seconds=2)),
        "unestimated-old": (account, "rtx4090", None, created),
        "unestimated-new": (account, "rtx4090", None, created + dt.timedelta(seconds=3)),
        "any-type": (account, None, soon + dt.timedelta(minutes=20), created + dt.timedelta(seconds=4)),
    }
    ids = {name: f"00000000-0000-4000-8000-{index:012d}" for index, name in enumerate(rows)}
    with session_factory() as session, session.begin():
        for name, (owner_account, gpu_type, start, made) in rows.items():
            session.add(Job(
                id=ids[name], account=owner_account, owner="alice", name=name, template="hello", params={}, gpus=1,
                gpu_type=gpu_type, cpus=1, mem_gb=1, time_limit_min=5, job_dir="/nonexistent", state="PENDING",
                reason="Resources", finished=False, request_hash="0" * 64, created_at=made, updated_at=dt.datetime.now(dt.UTC),
                expected_start_at=start,
            ))
    headers = bearer(settings, account)
    seen = {name: client.get(f"/jobs/{ids[name]}", headers=headers).get_json() for name in rows if rows[name][0] == account}
    # Another account's job counts (it is ahead in Slurm's queue too), but shows nothing of itself.
    assert {name: view["queue_position"] for name, view in seen.items()} == {
        "later": 2, "unestimated-old": 3, "unestimated-new": 4, "any-type": 1,
    }
    assert seen["later"]["estimated_start"] == f"{soon + dt.timedelta(minutes=10):%Y-%m-%dT%H:%M:%SZ}"
    assert seen["unestimated-old"]["estimated_start"] is None
    assert client.get("/jobs", headers=headers).get_json()["jobs"][0]["queue_position"] is None
