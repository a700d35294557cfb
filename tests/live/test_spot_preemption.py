"""Spot jobs on the real cluster: a full-price job preempts a spot job, which is requeued and runs again.

Account A's spot job holds all 4 GPUs; account B's full-price job arrives.
Slurm (PreemptType=preempt/qos, QOS spot preempted by normal with REQUEUE and
a grace time) sends A's job SIGTERM and requeues it; B's job runs; then A's
job runs again and completes. The test asks Slurm (sacct -D: both of A's runs,
each under QOS spot), the API (PREEMPTED between the runs, the run count, a
job.preempted webhook), the ledger and the invoice (both of A's runs at the
spot price and tier, B's at full price, each to the second of sacct's ElapsedRaw).

Needs every GPU of the shared cluster: it waits until the cluster is idle first.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient
from gpupool_client import verify_signature
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from bench.support.services import (
    TENANT_PREFIX,
    add_account_row,
    cancel_account_jobs,
    slurm_cmd,
    start_requeued_now,
    throwaway_slurm_account,
)
from bench.support.tenancy import sbatch_as_tenant
from billing import passes
from billing.calendar import period_of
from billing.money import format_nanos
from billing.price_book import SPOT_TIER
from billing.prices import set_price
from gpupool.config import Settings
from gpupool.models import LedgerEntry
from gpupool.proc import CommandResult, run_command
from gpupool.slurm.client import SlurmClient
from gpupool.webhooks.sender import WebhookSender
from tests.conftest import bearer, wait_for
from tests.support.receiver import WebhookReceiver, serve_webhooks

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

FULL, SPOT = 120_000, 40_000  # nano-units per GPU-second
GPUS = 4  # every GPU of the local cluster's node


def cluster_idle() -> bool:
    return not slurm_cmd("squeue", "-h", "-a", "-t", "RUNNING,PENDING,COMPLETING").strip()


@pytest.fixture
def two_accounts(slurm: SlurmClient, session_factory: sessionmaker) -> Iterator[tuple[str, str]]:
    # Other test sessions share the cluster: start only once it is idle, so the GPUs are the test's.
    wait_for(cluster_idle, timeout_s=300, interval_s=2, what="the shared cluster to be idle")
    with throwaway_slurm_account(slurm, "spa", gpu_limit=GPUS) as a, throwaway_slurm_account(slurm, "spb", gpu_limit=GPUS) as b:
        add_account_row(session_factory, a)
        add_account_row(session_factory, b)
        try:
            yield a, b
        finally:
            cancel_account_jobs(a)
            cancel_account_jobs(b)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with serve_webhooks() as state:
        yield state


@pytest.fixture
def settings(session_settings: Settings, tmp_path: Any) -> Settings:
    return session_settings.replace(
        webhook_allow_cidrs=("127.0.0.0/8",), webhook_backoff_s=0.05, billing_archive_dir=str(tmp_path / "archive")
    )


def sacct_runs(slurm_job_id: int) -> list[dict[str, str]]:
    """Every run of the job, as Slurm's accounting has it (-D: the runs before a requeue too)."""
    text = slurm_cmd(
        "sacct", "-X", "-D", "-P", "-n", "-j", str(slurm_job_id), "-o", "JobIDRaw,State,QOS,Start,End,ElapsedRaw,ExitCode"
    )
    names = ("id", "state", "qos", "start", "end", "elapsed", "exit")
    return [dict(zip(names, line.split("|"), strict=True)) for line in text.splitlines() if line.strip()]


def test_a_full_price_job_preempts_a_spot_job_which_runs_again_and_each_run_is_billed_at_its_tier(
    client: FlaskClient,
    settings: Settings,
    slurm: SlurmClient,
    session_factory: sessionmaker,
    two_accounts: tuple[str, str],
    receiver: WebhookReceiver,
) -> None:
    a, b = two_accounts
    since = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=5)
    with session_factory() as session, session.begin():
        set_price(session, "rtx4090", FULL, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        set_price(session, "rtx4090", SPOT, dt.datetime(2020, 1, 1, tzinfo=dt.UTC), SPOT_TIER)
    auth_a, auth_b = bearer(settings, a), bearer(settings, b)
    endpoint = client.post("/webhooks", json={"url": receiver.url, "events": ["job.preempted"]}, headers=auth_a)
    assert endpoint.status_code == 201, endpoint.get_json()
    secret = endpoint.get_json()["secret"]

    spot = {"template": "hello", "gpus": GPUS, "gpu_type": "rtx4090", "time_limit_min": 5, "params": {"seconds": 25}}
    submitted = client.post("/submit", json={**spot, "preemptible": True}, headers=auth_a)
    assert submitted.status_code == 201, submitted.get_json()
    job_a = submitted.get_json()
    assert job_a["preemptible"] is True
    seen_a: list[dict[str, Any]] = []

    def a_is(state: str, run_count: int | None = None) -> dict[str, Any] | None:
        body = client.get(f"/jobs/{job_a['job_id']}", headers=auth_a).get_json()
        seen_a.append(body)
        return body if body["state"] == state and run_count in (None, body["run_count"]) else None

    wait_for(lambda: a_is("RUNNING", 1), timeout_s=120, what="A's spot job to run")

    full = {"template": "hello", "gpus": GPUS, "gpu_type": "rtx4090", "time_limit_min": 5, "params": {"seconds": 5}}
    submitted_b = client.post("/submit", json=full, headers=auth_b)
    assert submitted_b.status_code == 201, submitted_b.get_json()
    job_b = submitted_b.get_json()

    preempted = wait_for(lambda: a_is("PREEMPTED"), timeout_s=120, interval_s=0.2, what="A's job to be preempted")
    assert preempted["run_count"] == 1 and preempted["ended_at"] is None
    # Slurm holds a requeued job back for about two minutes (its BeginTime); this test is about the tiers, not that
    # wait: bring the begin time forward, as an operator may. It still waits for B, which holds every GPU.
    start_requeued_now(job_a["slurm_job_id"])
    wait_for(
        lambda: client.get(f"/jobs/{job_b['job_id']}", headers=auth_b).get_json()["state"] == "COMPLETED",
        timeout_s=180, what="B's full-price job to complete",
    )
    # Other sessions' full-price jobs on the shared cluster may preempt it again: at least two runs.
    done = wait_for(lambda: a_is("COMPLETED"), timeout_s=900, interval_s=1, what="A's job to run again and complete")
    assert done["exit_code"] == 0 and done["run_count"] >= 2
    # Between its runs the API said PREEMPTED, never an end.
    states = [body["state"] for body in seen_a]
    assert states.index("PREEMPTED") < len(states) - 1 - states[::-1].index("RUNNING")

    # Slurm's own record: two runs of A's job, both under QOS spot, the first preempted; B's under normal.
    runs_a = sacct_runs(job_a["slurm_job_id"])
    preemptions = len(runs_a) - 1
    assert [(run["state"], run["qos"]) for run in runs_a] == [("PREEMPTED", "spot")] * preemptions + [("COMPLETED", "spot")], runs_a
    assert done["run_count"] == len(runs_a)
    # The job's own logs, both runs' (appended): the first run's script heard SIGTERM before the requeue.
    logs = {
        stream: client.get(f"/jobs/{job_a['job_id']}/logs?stream={stream}&offset=0", headers=auth_a).get_data(as_text=True)
        for stream in ("stdout", "stderr")
    }
    assert logs["stdout"].count("gpus on node: 4") == len(runs_a), logs
    assert logs["stderr"].count("gpupool: SIGTERM") == preemptions, logs
    (run_b,) = sacct_runs(job_b["slurm_job_id"])
    assert (run_b["state"], run_b["qos"]) == ("COMPLETED", "normal")
    assert runs_a[0]["end"] <= run_b["start"] <= run_b["end"] <= runs_a[1]["start"]

    # Billing: each run once, at the tier of the QOS sacct names, for its exact seconds.
    passes.run_pass(session_factory, slurm, settings, since=since)
    passes.run_pass(session_factory, slurm, settings, since=since)  # a second pass adds nothing
    with session_factory() as session:
        ledger = session.execute(
            select(LedgerEntry.account, LedgerEntry.run_start, LedgerEntry.gpu_seconds, LedgerEntry.unit_price_nanos, LedgerEntry.tier)
            .where(LedgerEntry.account.in_([a, b]), LedgerEntry.gpu_seconds != 0)
            .order_by(LedgerEntry.run_start)
        ).all()
    expected = sorted(
        [
            *((a, run["start"], GPUS * int(run["elapsed"]), SPOT, "spot") for run in runs_a),
            (b, run_b["start"], GPUS * int(run_b["elapsed"]), FULL, "normal"),
        ],
        key=lambda row: row[1],
    )
    assert [(acct, f"{start:%Y-%m-%dT%H:%M:%S}", gs, price, tier) for acct, start, gs, price, tier in ledger] == expected

    period = period_of(dt.datetime.fromisoformat(runs_a[-1]["start"]).replace(tzinfo=dt.UTC))
    for account, auth, runs, price, tier in ((a, auth_a, runs_a, SPOT, "spot"), (b, auth_b, [run_b], FULL, "normal")):
        reply = client.get(f"/invoices/{period}", headers=auth)
        assert reply.status_code == 200, reply.data
        lines = list(csv.DictReader(io.StringIO(reply.get_data(as_text=True))))
        jobs = [line for line in lines if line["line_type"] == "job"]
        assert [(line["billed_seconds"], line["unit_price"], line["tier"]) for line in jobs] == [
            (run["elapsed"], format_nanos(price), tier) for run in runs
        ], (account, lines)

    # The job.preempted webhook, signed, for A's job, once.
    sender = WebhookSender(session_factory, settings)
    try:
        wait_for(
            lambda: sender.run_once() >= 0 and len(receiver.deliveries) >= preemptions, timeout_s=60, interval_s=0.2,
            what="the job.preempted deliveries",
        )
    finally:
        sender.close()
    events = [verify_signature(d.body, d.headers["Gpupool-Signature"], secret) for d in receiver.deliveries]
    assert [(event["type"], event["data"]["job"]["job_id"]) for event in events] == [("job.preempted", job_a["job_id"])] * preemptions
    assert [event["data"]["job"]["run_count"] for event in events] == list(range(1, len(runs_a)))


def as_tenant(account: str, *argv: str) -> CommandResult:
    return run_command(
        ["/usr/sbin/runuser", "-u", TENANT_PREFIX + account, "--", *argv],
        timeout_s=30,
        env={"PATH": "/usr/bin:/bin", "TZ": "UTC", "LANG": "C.UTF-8"},
        check=False,
    )


def qos_of(slurm_job_id: int) -> str:
    return slurm_cmd("squeue", "-h", "-j", str(slurm_job_id), "-o", "%q").strip()


@pytest.fixture
def tenant_a(slurm: SlurmClient, session_factory: sessionmaker) -> Iterator[str]:
    with throwaway_slurm_account(slurm, "spq", gpu_limit=1) as name:
        add_account_row(session_factory, name)
        yield name


def test_a_tenant_cannot_move_a_spot_job_to_full_price_qos_and_pays_the_qos_it_runs_under(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, tenant_a: str
) -> None:
    since = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=5)
    with session_factory() as session, session.begin():
        set_price(session, "rtx4090", FULL, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        set_price(session, "rtx4090", SPOT, dt.datetime(2020, 1, 1, tzinfo=dt.UTC), SPOT_TIER)
    held = sbatch_as_tenant(tenant_a, "--gres=gpu:rtx4090:1", "--qos=spot", "--hold", wrap="true")
    assert qos_of(held) == "spot"

    # scontrol update of its QOS, as the tenant: Slurm refuses, and the job keeps QOS spot.
    # (job_submit.lua refuses it; slurmctld answers the tenant "Unspecified error".)
    for change in ("qos=normal", "QOS=normal"):
        refused = as_tenant(tenant_a, "scontrol", "update", f"jobid={held}", change)
        assert refused.returncode != 0 and refused.stderr.strip(), refused
        assert qos_of(held) == "spot"
    # A QOS beyond the association's normal and spot is refused at submit.
    beyond = as_tenant(
        tenant_a, "sbatch", "--parsable", f"--account={tenant_a}", "--partition=gpu", "--time=5", "--chdir=/tmp",
        "--output=/dev/null", "--gres=gpu:rtx4090:1", "--qos=root", "--wrap=true",
    )
    assert beyond.returncode != 0 and "QOS root is not offered" in beyond.stderr, beyond.stderr
    slurm_cmd("scancel", str(held))

    # Submitting around the API: --qos=normal is full price, --qos=spot the spot price;
    # the tier billed is the QOS sacct records for the run, whatever was asked where.
    direct = {
        qos: sbatch_as_tenant(tenant_a, "--gres=gpu:rtx4090:1", f"--qos={qos}", wrap="sleep 2")
        for qos in ("normal", "spot")
    }

    def finished() -> bool:
        return all(
            (runs := sacct_runs(job_id)) and runs[-1]["state"] == "COMPLETED" and runs[-1]["end"] not in ("", "Unknown")
            for job_id in direct.values()
        )

    wait_for(finished, timeout_s=240, interval_s=1, what="the directly submitted jobs to complete")
    assert {qos: sacct_runs(job_id)[-1]["qos"] for qos, job_id in direct.items()} == {"normal": "normal", "spot": "spot"}
    passes.run_pass(session_factory, slurm, settings, since=since)
    with session_factory() as session:
        billed = {
            job_id: (tier, price)
            for job_id, tier, price in session.execute(
                select(LedgerEntry.job_id_raw, LedgerEntry.tier, LedgerEntry.unit_price_nanos).where(
                    LedgerEntry.account == tenant_a, LedgerEntry.gpu_seconds > 0
                )
            )
        }
    assert billed == {direct["normal"]: ("normal", FULL), direct["spot"]: ("spot", SPOT)}
