"""Billing real jobs on the local cluster, checked against sacct to the second.

The jobs are submitted straight to Slurm with ``sbatch --account``, as a
customer's own scripts would, except one that goes through the API.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api import create_app
from bench.support.tenancy import sbatch_as_tenant
from billing.calendar import period_of
from gpupool.clock import FrozenClock
from gpupool.errors import CommandFailed
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import gpus_by_type, parse_delimited, parse_time
from tests.billing.conftest import RTX4090_NANOS, LedgerDb
from tests.conftest import SUITE_NOW, bearer, slurm_cmd, throwaway_slurm_account, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
DAEMON = Path("/usr/local/sbin/gpupool-daemon")


def sbatch(account: str, *options: str, wrap: str = "sleep 2") -> int:
    """Plain sbatch by the account's tenant: jobs outside the API are billed too."""
    return sbatch_as_tenant(account, *options, wrap=wrap)


def state_of(job_id: int) -> str:
    return slurm_cmd("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).strip()


def sacct_runs(*job_ids: int) -> list[dict[str, str]]:
    """Every run (-D) of these jobs, array tasks included, as sacct reports them."""
    text = slurm_cmd(
        "sacct", "-X", "-D", "-P", "-j", ",".join(map(str, job_ids)),
        "-o", "JobIDRaw,JobID,State,Start,End,ElapsedRaw,AllocTRES,JobName",
    )
    return parse_delimited(text)


def wait_finished(*job_ids: int) -> list[dict[str, str]]:
    def done() -> list[dict[str, str]] | None:
        try:
            runs = sacct_runs(*job_ids)
        except CommandFailed:  # slurmdbd still starting
            return None
        unfinished = {"PENDING", "RUNNING", "REQUEUED", "COMPLETING", "SUSPENDED"}
        busy = any(state_of(job) for job in job_ids)
        last: dict[str, dict[str, str]] = {}
        for run in runs:
            last[run["JobID"]] = run
        # slurmdbd may know the final state before it knows the end time.
        settled = all(r["State"].split()[0] not in unfinished and r["End"] != "Unknown" for r in last.values())
        return runs if runs and settled and not busy else None

    return wait_for(done, timeout_s=240, interval_s=1, what=f"jobs {job_ids} to finish in sacct")


def wait_running_for(job_id: int, seconds: int) -> None:
    wait_for(lambda: state_of(job_id) == "RUNNING", timeout_s=120, what=f"job {job_id} to run")
    time.sleep(seconds)


def assert_billed_exactly(ledger: LedgerDb, runs: list[dict[str, str]], context: str = "") -> None:
    """Per run with GPUs: rows contiguous from Start, and GPU-seconds = GPUs x ElapsedRaw."""
    rows = ledger.ledger()
    for run in runs:
        start = parse_time(run["Start"])
        gpus = sum(gpus_by_type(run["AllocTRES"]).values())
        mine = [r for r in rows if r[3] == int(run["JobIDRaw"]) and r[4] == start]
        if start is None or gpus == 0 or int(run["ElapsedRaw"]) == 0:
            assert mine == [], f"run {run} billed although it never held a GPU"
            continue
        elapsed = int(run["ElapsedRaw"])
        assert sum(r[14] for r in mine) == gpus * elapsed, (run, mine, context)
        assert sum(r[16] for r in mine) == gpus * elapsed * RTX4090_NANOS
        assert mine[0][11] == start
        assert start + dt.timedelta(seconds=sum(r[13] for r in mine)) == parse_time(run["End"])
        assert {r[2] for r in mine} == {run["JobID"]}


@pytest.fixture(scope="module")
def account(pg_ledger: LedgerDb) -> Iterator[str]:
    client = SlurmClient(pg_ledger.settings)
    with throwaway_slurm_account(client, "bill", gpu_limit=4) as name:
        pg_ledger.add_account(name)
        yield name


@pytest.fixture(scope="module")
def finished_jobs(account: str) -> dict[str, int]:
    """A day's worth of shapes, all finished: 1, 2 and 4 GPUs, cancelled, array, requeued, odd names."""
    jobs = {
        "one": sbatch(account, "--gres=gpu:1", wrap="sleep 3"),
        "two": sbatch(account, "--gres=gpu:2", wrap="sleep 4"),
        "four": sbatch(account, "--gres=gpu:rtx4090:4", wrap="sleep 2"),
        "pipe": sbatch(account, "--gres=gpu:1", "--job-name=a|b c", wrap="sleep 2"),
        "array": sbatch(account, "--gres=gpu:1", "--array=0-1", wrap="sleep 2"),
        "pending": sbatch(account, "--gres=gpu:1", "--begin=now+3600", wrap="true"),
        "running": sbatch(account, "--gres=gpu:1", wrap="sleep 300"),
        "requeue": sbatch(
            account, "--gres=gpu:1", "--requeue",
            wrap='if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then sleep 2; else sleep 300; fi',
        ),
    }
    slurm_cmd("scancel", str(jobs["pending"]))
    wait_running_for(jobs["running"], 3)
    slurm_cmd("scancel", str(jobs["running"]))
    wait_running_for(jobs["requeue"], 3)
    slurm_cmd("scontrol", "requeue", str(jobs["requeue"]))
    # A requeued job waits out a begin delay of minutes; shorten it, but not to nothing:
    # slurmd refuses ("already killed") a relaunch that comes before the kill is done.
    wait_for(lambda: state_of(jobs["requeue"]) == "PENDING", timeout_s=60, what="the requeued job to pend")
    slurm_cmd("scontrol", "update", f"jobid={jobs['requeue']}", "starttime=now+3")
    wait_finished(*jobs.values())
    return jobs


def test_two_concurrent_passes_bill_every_run_exactly_once(pg_ledger: LedgerDb, finished_jobs: dict[str, int]) -> None:
    env = {"GPUPOOL_BILLING_CREDIT_FAILED_NODES": "true"}
    results: list[subprocess.CompletedProcess[str]] = []

    def one_pass() -> None:
        results.append(pg_ledger.cli("billing", "run", **env))

    threads = [threading.Thread(target=one_pass) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    # As on two API hosts' timers: the second either found the first's run lock (gpupool.db.locks) and
    # did nothing, or started after it and billed nothing new. Either way one billed.
    billed = [r.stdout for r in results if r.stdout.startswith("pass ")]
    skipped = [r.stdout for r in results if r.stdout.startswith("another billing run holds the lock")]
    assert len(billed) >= 1 and len(billed) + len(skipped) == 2, [r.stdout for r in results]
    runs = sacct_runs(*finished_jobs.values())
    assert_billed_exactly(pg_ledger, runs)
    rows = pg_ledger.ledger()
    assert len(rows) == len(set(rows))
    # A third pass, alone, finds nothing new.
    again = pg_ledger.cli("billing", "run")
    assert again.returncode == 0 and " 0 ledger rows" in again.stdout


def test_each_shape_is_billed_as_sacct_recorded_it(pg_ledger: LedgerDb, finished_jobs: dict[str, int], account: str) -> None:
    runs = sacct_runs(*finished_jobs.values())
    by_job: dict[str, list[tuple]] = {}
    for r in pg_ledger.ledger(account):
        by_job.setdefault(r[2], []).append(r)
    one, two, four = (str(finished_jobs[k]) for k in ("one", "two", "four"))
    assert [r[9] for r in by_job[one]] == [1] and [r[9] for r in by_job[two]] == [2] and [r[9] for r in by_job[four]] == [4]
    assert str(finished_jobs["pending"]) not in by_job  # cancelled while pending: no charge
    assert by_job[str(finished_jobs["running"])][-1][7] == "CANCELLED"
    assert by_job[str(finished_jobs["pipe"])][0][6] == "a|b c"
    array_ids = sorted(k for k in by_job if k.startswith(f"{finished_jobs['array']}_"))
    assert array_ids == [f"{finished_jobs['array']}_0", f"{finished_jobs['array']}_1"]
    requeued = [run for run in runs if run["JobIDRaw"] == str(finished_jobs["requeue"])]
    billed_starts = {r[4] for r in by_job[str(finished_jobs["requeue"])]}
    started = {parse_time(run["Start"]) for run in requeued if int(run["ElapsedRaw"]) > 0}
    assert len(started) == 2 and billed_starts == started  # both runs billed, separately
    assert_billed_exactly(pg_ledger, runs)


def run_periods(runs: list[dict[str, str]]) -> list[str]:
    """The months these runs touched: a run across a real month's end is on two invoices."""
    moments = [parse_time(run[field]) for run in runs for field in ("Start", "End")]
    return sorted({period_of(moment) for moment in moments if moment is not None})


def test_invoice_lines_match_sacct(pg_ledger: LedgerDb, finished_jobs: dict[str, int], account: str) -> None:
    sacct_by_id = {run["JobID"]: run for run in sacct_runs(finished_jobs["one"], finished_jobs["two"])}
    jobs = []
    for period in run_periods(list(sacct_by_id.values())):
        result = pg_ledger.cli("invoice", "--account", account, "--period", period, "-o", "-")
        assert result.returncode == 0, result.stderr
        lines = list(csv.DictReader(io.StringIO(result.stdout)))
        jobs += [line for line in lines if line["line_type"] == "job"]
        total = lines[-1]
        assert total["line_type"] == "total"
        cents = sum(round(float(line["amount"]) * 100) for line in lines[:-1])
        assert round(float(total["amount"]) * 100) == cents
    for job_id in (str(finished_jobs["one"]), str(finished_jobs["two"])):
        mine = [line for line in jobs if line["slurm_job_id"] == job_id]
        run = sacct_by_id[job_id]
        assert mine[0]["start"] == run["Start"] + "Z" and mine[-1]["end"] == run["End"] + "Z"
        assert sum(int(line["billed_seconds"]) for line in mine) == int(run["ElapsedRaw"])
        assert sum(int(line["gpu_seconds"]) for line in mine) == int(mine[0]["gpus"]) * int(run["ElapsedRaw"])


def test_a_running_job_is_metered_pass_by_pass(pg_ledger: LedgerDb, account: str) -> None:
    # Long enough that both passes below find it running even on a loaded machine.
    job = sbatch(account, "--gres=gpu:2", wrap="sleep 30")
    wait_running_for(job, 4)
    assert pg_ledger.cli("billing", "run").returncode == 0
    first = [r for r in pg_ledger.ledger(account) if r[3] == job]
    assert len(first) == 1 and first[0][7] == "RUNNING" and first[0][13] >= 4
    time.sleep(3)
    assert state_of(job) == "RUNNING", "the job ended before the second pass: the machine is too slow for this test"
    assert pg_ledger.cli("billing", "run").returncode == 0
    runs = wait_finished(job)
    assert pg_ledger.cli("billing", "run").returncode == 0
    mine = [r for r in pg_ledger.ledger(account) if r[3] == job]
    assert len(mine) >= 3 and mine[-1][7] == "COMPLETED"
    assert_billed_exactly(pg_ledger, runs)


def test_the_api_job_carries_its_gpupool_id_into_the_ledger(pg_ledger: LedgerDb, account: str) -> None:
    app = create_app(pg_ledger.settings.replace(refresh_interval_s=1.0), session_factory=pg_ledger.sessions, clock=FrozenClock(SUITE_NOW))
    client = app.test_client()
    headers = bearer(pg_ledger.settings, account)
    created = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 1, "params": {"seconds": 2}})
    assert created.status_code == 201, created.get_json()
    job = created.get_json()
    runs = wait_finished(job["slurm_job_id"])
    billed = pg_ledger.cli("billing", "run")
    assert billed.returncode == 0, billed.stderr
    mine = [r for r in pg_ledger.ledger(account) if r[3] == job["slurm_job_id"]]
    if not mine:
        # Seen about one run in three under load: a pass just after the job's end misses it, and
        # the next pass bills it (exactly once, below). Open question, see the stop-25 note.
        billed = pg_ledger.cli("billing", "run")
        assert billed.returncode == 0, billed.stderr
        mine = [r for r in pg_ledger.ledger(account) if r[3] == job["slurm_job_id"]]
    assert mine and {r[5] for r in mine} == {job["job_id"]}, (billed.stdout, billed.stderr, runs, pg_ledger.mark())
    assert_billed_exactly(pg_ledger, runs)
    for period in run_periods(runs):
        invoice = client.get(f"/invoices/{period}", headers=headers)
        assert invoice.status_code == 200
        assert any(line.startswith(f"job,{job['job_id']},{job['slurm_job_id']},") for line in invoice.get_data(as_text=True).splitlines())


@pytest.mark.skipif(not DAEMON.exists(), reason="needs the playbook's gpupool-daemon (no systemd here)")
def test_slurmdbd_down_fails_the_pass_cleanly_and_nothing_is_lost(pg_ledger: LedgerDb, account: str) -> None:
    assert pg_ledger.cli("billing", "run").returncode == 0
    before, mark = pg_ledger.ledger(), pg_ledger.mark()
    subprocess.run([str(DAEMON), "stop", "slurmdbd"], check=True, capture_output=True, timeout=60)
    try:
        job = sbatch(account, "--gres=gpu:1", wrap="sleep 3")  # slurmctld keeps its records for slurmdbd
        wait_for(lambda: state_of(job) in ("", "COMPLETED"), timeout_s=120, what=f"job {job} to end")
        failed = pg_ledger.cli("billing", "run")
        assert failed.returncode == 1
        assert "nothing was written and the mark did not move" in failed.stderr
        assert "sacct" in failed.stderr
        assert pg_ledger.ledger() == before and pg_ledger.mark() == mark
    finally:
        subprocess.run([str(DAEMON), "start", "slurmdbd"], check=True, capture_output=True, timeout=60)
    runs = wait_finished(job)
    assert pg_ledger.cli("billing", "run").returncode == 0
    assert_billed_exactly(pg_ledger, runs)
    assert pg_ledger.mark() > mark


def test_backfill_bills_a_window_in_passes_and_rerunning_it_adds_nothing(pg_ledger: LedgerDb, account: str) -> None:
    job = sbatch(account, "--gres=gpu:2", wrap="sleep 3")
    runs = wait_finished(job)
    start = parse_time(runs[0]["Start"])
    assert start is not None
    since = (start - dt.timedelta(hours=25)).strftime("%Y-%m-%dT%H:%M:%S")
    mark = pg_ledger.mark()
    backfill = pg_ledger.cli("billing", "run", "--since", since, "--until", dt.datetime.now(dt.UTC).isoformat())
    assert backfill.returncode == 0, backfill.stderr
    assert "in 2 passes" in backfill.stdout  # 24 h windows
    if not [r for r in pg_ledger.ledger(account) if r[3] == int(job)]:
        # As above: a pass just after the job's end may miss it; a second backfill of the same
        # window bills it, once.
        backfill = pg_ledger.cli("billing", "run", "--since", since, "--until", dt.datetime.now(dt.UTC).isoformat())
        assert backfill.returncode == 0, backfill.stderr
    assert_billed_exactly(pg_ledger, runs, context=backfill.stdout + backfill.stderr)
    # This account's rows: another account's job still running on the shared cluster is rightly
    # metered again by the rerun, so the whole ledger may grow.
    rows = pg_ledger.ledger(account)
    again = pg_ledger.cli("billing", "run", "--since", since)
    assert again.returncode == 0, again.stderr
    assert pg_ledger.ledger(account) == rows
    assert mark is None or pg_ledger.mark() >= mark  # a backfill never moves the mark back
    assert pg_ledger.cli("billing", "run", "--since", "2026-12-02", "--until", "2026-12-01").returncode == 2


def test_an_exhausted_account_has_its_jobs_cancelled_when_the_operator_asks(pg_ledger: LedgerDb, account: str) -> None:
    job = sbatch(account, "--gres=gpu:1", wrap="sleep 300")
    wait_running_for(job, 3)
    assert pg_ledger.cli("account", "set", account, "--credit", "0.0001").returncode == 0
    try:
        untouched = pg_ledger.cli("billing", "run")  # the setting is off by default
        assert untouched.returncode == 0 and state_of(job) == "RUNNING"
        cancelling = pg_ledger.cli("billing", "run", GPUPOOL_BILLING_CANCEL_EXHAUSTED="true")
        assert cancelling.returncode == 0, cancelling.stderr
        assert f"account {account} has no budget left: its jobs were cancelled" in cancelling.stdout
        runs = wait_finished(job)
        assert runs[-1]["State"].startswith("CANCELLED")
    finally:
        pg_ledger.cli("account", "set", account, "--credit", "none")
    assert pg_ledger.cli("billing", "run").returncode == 0
    assert_billed_exactly(pg_ledger, sacct_runs(job))
