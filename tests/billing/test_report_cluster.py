"""The operator report on the real cluster: known jobs, billed, then every figure checked against
Slurm's own records (sacct for the jobs, sreport for slurmdbd's hourly roll-up)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest

from bench.support.tenancy import sbatch_as_tenant
from billing.money import format_cents, format_nanos, round_to_cents
from billing.report import build_report, energy_nanos, gpu_hours, overlap_s
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import gpus_by_type, parse_delimited, parse_time
from gpupool.slurm.report import parse_sreport_utilization
from tests.billing.conftest import RTX4090_NANOS, LedgerDb
from tests.conftest import slurm_cmd, throwaway_slurm_account, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NODE_PRICE, NODE_WATTS, KWH_PRICE = "2400", 1800, "0.15"


def sbatch(account: str, *options: str, wrap: str) -> int:
    return sbatch_as_tenant(account, *options, wrap=wrap)


def finished_records(job_ids: list[int]) -> list[dict[str, str]]:
    """sacct's final records of the jobs; a busy shared cluster may queue them for minutes first."""
    fields = "JobIDRaw,State,Submit,Start,End,ElapsedRaw,AllocTRES"

    def done() -> list[dict[str, str]] | None:
        records = parse_delimited(slurm_cmd("sacct", "-X", "-P", "-j", ",".join(map(str, job_ids)), "-o", fields))
        settled = len(records) == len(job_ids) and all(r["State"] == "COMPLETED" and r["End"] != "Unknown" for r in records)
        return records if settled else None

    return wait_for(done, timeout_s=900, interval_s=2, what=f"jobs {job_ids} to complete in sacct")


def utc_text(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def account(pg_ledger: LedgerDb) -> Iterator[str]:
    client = SlurmClient(pg_ledger.settings)
    with throwaway_slurm_account(client, "rep", gpu_limit=4) as name:
        pg_ledger.add_account(name)
        yield name


@pytest.fixture(scope="module")
def known_jobs(pg_ledger: LedgerDb, account: str) -> dict[str, Any]:
    """1 GPU x ~5 s and 2 GPUs x ~5 s, finished and billed; the window [first submit, last end + 1 s)."""
    jobs = [sbatch(account, "--gres=gpu:rtx4090:1", wrap="sleep 5"), sbatch(account, "--gres=gpu:rtx4090:2", wrap="sleep 5")]
    records = finished_records(jobs)
    billed = pg_ledger.cli("billing", "run")
    assert billed.returncode == 0, billed.stderr
    since = min(parse_time(r["Submit"]) for r in records)
    until = max(parse_time(r["End"]) for r in records) + dt.timedelta(seconds=1)
    return {"jobs": jobs, "records": records, "since": since, "until": until}


def report_json(ledger: LedgerDb, since: dt.datetime, until: dt.datetime) -> dict[str, Any]:
    result = ledger.cli(
        "report", "--since", utc_text(since), "--until", utc_text(until), "--format", "json",
        GPUPOOL_ELECTRICITY_PRICE_PER_KWH=KWH_PRICE,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def allocated_by_sacct(since: dt.datetime, until: dt.datetime) -> int:
    """Every user's GPU allocations in the window, straight from sacct: GPUs x seconds of [Start, End) inside it."""
    text = slurm_cmd(
        "sacct", "--allusers", "-X", "-D", "-P", "-S", f"{since:%Y-%m-%dT%H:%M:%S}", "-E", f"{until:%Y-%m-%dT%H:%M:%S}",
        "-o", "JobIDRaw,State,Start,End,AllocTRES",
    )
    total = 0
    for row in parse_delimited(text):
        start = parse_time(row["Start"])
        if start is None or row["State"] == "PENDING":
            continue
        end = parse_time(row["End"]) if row["State"] != "RUNNING" else None
        total += sum(gpus_by_type(row["AllocTRES"]).values()) * overlap_s(start, end or until, since, until)
    return total


def test_revenue_gpu_hours_and_queue_wait_match_sacct(pg_ledger: LedgerDb, account: str, known_jobs: dict[str, Any]) -> None:
    records = known_jobs["records"]
    gpu_seconds = sum(sum(gpus_by_type(r["AllocTRES"]).values()) * int(r["ElapsedRaw"]) for r in records)
    assert sorted(sum(gpus_by_type(r["AllocTRES"]).values()) for r in records) == [1, 2]
    report = report_json(pg_ledger, known_jobs["since"], known_jobs["until"])
    (mine,) = [line for line in report["revenue_by_account"] if line["account"] == account]
    # Money as the invoice has it: each run's line rounded to the cent, then summed (issue 35).
    cents = sum(round_to_cents(sum(gpus_by_type(r["AllocTRES"]).values()) * int(r["ElapsedRaw"]) * RTX4090_NANOS) for r in records)
    assert mine == {"account": account, "gpu_seconds": gpu_seconds, "amount": format_cents(cents)}
    # The same in the table an operator reads.
    table = pg_ledger.cli("report", "--since", utc_text(known_jobs["since"]), "--until", utc_text(known_jobs["until"]))
    assert f"{account}  {gpu_hours(gpu_seconds)}" in table.stdout and f"{cents // 100}.{cents % 100:02d}" in table.stdout
    assert report["gpu_seconds_sold"] == sum(line["gpu_seconds"] for line in report["revenue_by_account"])
    assert report["gpu_hours_sold"] == gpu_hours(report["gpu_seconds_sold"])
    # Allocated GPU-seconds: exactly what sacct records for everyone's jobs in the window, ours included.
    allocated = report["utilization"]["allocated_gpu_seconds"]
    assert allocated == allocated_by_sacct(known_jobs["since"], known_jobs["until"])
    assert allocated >= gpu_seconds
    assert sum(line["allocated_gpu_seconds"] for line in report["utilization_by_node"]) == allocated
    # Queue wait: start - submit of our two runs, as sacct has them.
    waits = sorted(int((parse_time(r["Start"]) - parse_time(r["Submit"])).total_seconds()) for r in records)
    (ours,) = [line for line in report["queue_wait"]["by_account"] if line["account"] == account]
    assert ours == {"account": account, "jobs": 2, "p50_s": waits[0], "p95_s": waits[1], "max_s": waits[1]}


def test_payback_uses_the_node_cost_the_operator_set(pg_ledger: LedgerDb, known_jobs: dict[str, Any]) -> None:
    node = slurm_cmd("sinfo", "--Node", "-h", "-o", "%N").split()[0]
    since = known_jobs["since"] - dt.timedelta(days=1)
    result = pg_ledger.cli("node", "cost", "set", node, "--price", NODE_PRICE, "--since", utc_text(since), "--watts", str(NODE_WATTS))
    assert result.returncode == 0, result.stderr
    report = report_json(pg_ledger, known_jobs["since"], known_jobs["until"])
    (line,) = [line for line in report["payback"]["nodes"] if line["node"] == node]
    lived = int((known_jobs["until"] - since).total_seconds())
    electricity = energy_nanos(NODE_WATTS, lived, 150_000_000)
    assert line["electricity_to_date"] == format_nanos(electricity)
    assert line["cost_to_date"] == format_nanos(2400 * 10**9 + electricity)
    revenue = sum(int(x["gpu_seconds"]) for x in report["revenue_by_account"]) * RTX4090_NANOS
    assert line["revenue"] == format_nanos(revenue)  # one node: every run in the window ran on it
    assert line["paid_back"] is False and report["payback"]["total"]["cost_to_date"] == line["cost_to_date"]


def test_utilization_agrees_with_sreport_over_rolled_up_hours(pg_ledger: LedgerDb) -> None:
    """sreport reads slurmdbd's hourly roll-up, which covers whole hours once they are over.

    For each of the last six whole hours sreport has rolled up, the report's allocated and
    available GPU-seconds equal sreport's Allocated and Reported - Down - Planned Down. The
    current hour, where the jobs above ran, is not rolled up until it ends: a fresh cluster
    (as in CI) may have no rolled-up hour yet, and then only sreport's own relation is checked.
    """
    slurm = SlurmClient(pg_ledger.settings)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    this_hour = now.replace(minute=0, second=0)
    compared = 0
    for back in range(1, 7):
        start = this_hour - dt.timedelta(hours=back)
        end = start + dt.timedelta(hours=1)
        rolled = parse_sreport_utilization(
            slurm_cmd("sreport", "-P", "-t", "seconds", "-T", "gres/gpu", "cluster", "utilization", f"start={start:%Y-%m-%dT%H:%M:%S}", f"end={end:%Y-%m-%dT%H:%M:%S}")
        )
        if rolled is None or rolled.reported == 0:
            continue
        assert rolled.allocated + rolled.down + rolled.planned_down + rolled.idle + rolled.planned == rolled.reported
        with pg_ledger.sessions() as session:
            report = build_report(session, slurm, pg_ledger.settings, start, end, now)
        assert report.utilization.allocated_gpu_seconds == rolled.allocated, (start, rolled)
        assert report.utilization.available_gpu_seconds == rolled.reported - rolled.down - rolled.planned_down, (start, rolled)
        compared += 1
    if compared == 0:
        pytest.skip(f"slurmdbd has rolled up no whole hour with GPUs before {this_hour:%H:%M} UTC yet (fresh cluster); compared nothing")
