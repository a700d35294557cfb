"""bench/scale: gpupool holding 10,000 unfinished jobs, Slurm's default MaxJobCount, beside raw Slurm.

Builds the jobs through the API (POST /submit at concurrency 16, under gunicorn as the
service user); the bench account's Slurm GPU limit is 0, so all of them stay pending,
as in bench/submit. Slurm refuses jobs past MaxJobCount, which counts every job
slurmctld holds, anyone's: the bench builds at most MaxJobCount less the jobs already
there less a little headroom, and says so when that is under 10,000. Then, side by side:

- one state refresh (JobStateRefresher.refresh: squeue, sacct of the stragglers, the
  database update) against the raw squeue it runs. 100 jobs are cancelled first, behind
  gpupool's back, so squeue forgets them and sacct must answer. The first refresh
  also writes every row (Slurm's pending reason, last_seen_at); later ones write none.
  Targets: <= 2x raw squeue and <= 1 s;
- GET /jobs/<id> throughput (wrk, 16 connections) with 10,000 unfinished jobs against
  the same with 10, the shared refresh every 5 s included: within 10%;
- GET /jobs?state=PENDING, first page and 50th page (default page size 50): p50 <= 20 ms;
- one billing pass (billing.passes.run_pass, real sacct) over a window holding the
  10,000 pending jobs and 500 one-second 1-GPU jobs a second account ran to completion
  meanwhile (the one node has 4 GPUs: 500 jobs cannot run at once): <= 10 s;
- sustained submission, 60 s at concurrency 16: POST /submit against raw sbatch as the
  tenant, each after the queue is emptied.

Every bench job is cancelled at the end. Usage: python -m bench.scale [--jobs 10000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._harness import REPO, bench_env, gunicorn, http, median, require_wrk, run_workers, slurm, table
from bench.submit import burst_seconds, raw_sbatch
from bench.support.services import add_account_row, throwaway_slurm_account
from billing.passes import run_pass
from billing.price_book import ANY_GPU_TYPE
from billing.prices import set_price
from gpupool import db
from gpupool.config import load_settings
from gpupool.jobstate import JobStateRefresher
from gpupool.proc import minimal_env, run_command
from gpupool.slurm.client import _QUEUE_FORMAT, SlurmClient

JOBS = 10_000
HEADROOM = 100  # jobs left for the cluster's other users under MaxJobCount
STRAGGLERS = 100
COMPLETED_RUNS = 500
BUILD_CONCURRENCY = 16
SUSTAIN_S = 60
SUSTAIN_CONCURRENCY = 16
WRK_S = 10
WRK_CONNECTIONS = 16
PAGE_SAMPLES = 30
REFRESH_INTERVAL_S = 5.0
BODY = {"template": "hello", "gpus": 1, "params": {"message": "scale"}}


def max_job_count() -> int:
    match = re.search(r"^MaxJobCount\s*=\s*(\d+)", slurm("scontrol", "show", "config"), re.MULTILINE)
    if match is None:
        raise RuntimeError("scontrol show config names no MaxJobCount")
    return int(match[1])


def jobs_in_controller(account: str | None = None) -> int:
    args = ["squeue", "-h", "--states=all", "-o", "%i"] + ([f"--account={account}"] if account else [])
    return len(slurm(*args).split())


def wait_drained(account: str, timeout_s: float = 600) -> None:
    """Until slurmctld has let go of every job of ``account`` (MinJobAge after it ended)."""
    deadline = time.monotonic() + timeout_s
    while jobs_in_controller(account) and time.monotonic() < deadline:
        time.sleep(2)


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def sustained_rate(action: Callable[[], None], seconds: float, concurrency: int) -> float:
    """Jobs/s of ``action`` from ``concurrency`` threads kept busy for ``seconds``."""
    count = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker() -> None:
        while time.monotonic() < stop_at:
            action()
            with lock:
                count[0] += 1

    return count[0] / run_workers(worker, concurrency)


def wrk_rate(url: str, token: str, job_id: str) -> float:
    result = run_command(
        ["wrk", "-t", "2", "-c", str(WRK_CONNECTIONS), "-d", f"{WRK_S}s", "--timeout", "10s",
         "-H", f"Authorization: Bearer {token}", f"{url}/jobs/{job_id}"],
        timeout_s=WRK_S + 60, env=minimal_env(),
    )
    if "Non-2xx" in result.stdout:
        raise RuntimeError(f"GET /jobs/<id> failed under wrk:\n{result.stdout}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", result.stdout)
    assert match is not None, result.stdout
    return float(match[1])


def page_p50s(url: str, token: str) -> tuple[float, float]:
    """p50 of GET /jobs?state=PENDING's first page and of its 50th, reached by following cursors."""
    first = f"{url}/jobs?state=PENDING"
    page = first
    for _ in range(49):
        reply = http("GET", page, token=token)
        assert reply.status == 200 and reply.body["next_cursor"], reply.body
        page = f"{first}&cursor={reply.body['next_cursor']}"
    samples: dict[str, list[float]] = {"first": [], "fiftieth": []}
    for _ in range(PAGE_SAMPLES):
        for name, address in (("first", first), ("fiftieth", page)):
            started = time.perf_counter()
            reply = http("GET", address, token=token)
            samples[name].append(time.perf_counter() - started)
            assert reply.status == 200 and len(reply.body["jobs"]) == 50, reply.body
    return median(samples["first"]), median(samples["fiftieth"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=JOBS)
    args = parser.parse_args()
    require_wrk("bench/scale")  # before the minutes of building the queue, not after
    rows: list[tuple[str, str]] = []

    def report(row: tuple[str, str]) -> None:
        rows.append(row)
        print(f"{row[0]}: {row[1]}", flush=True)  # a late failure keeps the figures so far
    with tempfile.TemporaryDirectory() as tmp, bench_env(Path(tmp), slurm_gpu_limit=0) as env:
        account, token, job_root = env["account"], env["token"], Path(env["job_root"])
        settings = load_settings(
            environ={},
            overrides={
                "database_url": env["database_url"], "job_root": str(job_root), "runas_socket": env["runas_socket"],
                "service_group": "gpupool", "templates_dir": str(REPO / "slurm_templates"),
                "billing_archive_dir": str(Path(tmp) / "archive"),
            },
        )
        slurm_client = SlurmClient(settings)
        engine = db.make_engine(env["database_url"])
        sessions = db.make_session_factory(engine)
        with throwaway_slurm_account(slurm_client, "r", 4) as runner_account, gunicorn(
            env, workers=4, refresh_interval_s=str(REFRESH_INTERVAL_S)
        ) as url:
            add_account_row(sessions, runner_account)

            def submitted_job() -> dict[str, Any]:
                reply = http("POST", url + "/submit", token=token, body=BODY)
                if reply.status != 201:
                    raise RuntimeError(f"submit failed: {reply.status} {reply.body}")
                return reply.body

            def api_submit() -> None:
                submitted_job()

            # 500 short runs of a second account, first: behind 10,000 pending jobs Slurm's
            # scheduler would reach them (and every other user's jobs) only on its slow passes.
            short_runs = raw_sbatch(runner_account, job_root, seconds=1)
            for _ in range(COMPLETED_RUNS):
                short_runs()
            wait_drained(runner_account)

            first_jobs = [submitted_job() for _ in range(10)]
            polled_job = first_jobs[0]["job_id"]
            poll_rate_10 = wrk_rate(url, token, polled_job)

            # MaxJobCount counts every job slurmctld holds, anyone's: past it, sbatch waits and retries.
            limit, already = max_job_count(), jobs_in_controller()
            target = min(args.jobs, limit - already - HEADROOM + 10)
            if target < args.jobs:
                print(f"MaxJobCount is {limit} and slurmctld holds {already} jobs: building {target}, not {args.jobs}")
            build_s = burst_seconds(api_submit, target - 10, BUILD_CONCURRENCY)
            report(("build through POST /submit", f"{target} jobs at {(target - 10) / build_s:.0f} jobs/s (conc. 16)"))

            # Stragglers: ended behind gpupool's back, gone from squeue, only sacct answers for them.
            stragglers = [str(job["slurm_job_id"]) for job in first_jobs[1:]] + [
                line for line in slurm("squeue", "-h", f"--account={account}", "-o", "%i").split()[: STRAGGLERS - 9]
            ]
            slurm("scancel", *stragglers)
            time.sleep(12)  # MinJobAge (5 s here) and slurmctld's purge pass

            refresher = JobStateRefresher(sessions, slurm_client, interval_s=REFRESH_INTERVAL_S, submission_grace_s=60)
            squeue_argv = [settings.slurm_bin("squeue"), "--states=all", f"--format={_QUEUE_FORMAT}"]
            raw_squeue = [timed(lambda: run_command(squeue_argv, timeout_s=60, env=minimal_env())) for _ in range(5)]
            first_refresh = timed(refresher.refresh)
            later_refreshes = [timed(refresher.refresh) for _ in range(3)]
            raw_squeue += [timed(lambda: run_command(squeue_argv, timeout_s=60, env=minimal_env())) for _ in range(5)]
            raw = median(raw_squeue)
            queued = jobs_in_controller()
            report((f"raw squeue, {queued} jobs in slurmctld", f"{raw * 1000:.0f} ms (p50 of 10)"))
            report((
                f"refresh, first ({STRAGGLERS} via sacct, all rows written)",
                f"{first_refresh * 1000:.0f} ms = {first_refresh / raw:.1f}x raw (targets <= 2x, <= 1 s)",
            ))
            later = median(later_refreshes)
            report(("refresh, later (nothing changed)", f"{later * 1000:.0f} ms = {later / raw:.1f}x raw (p50 of 3)"))

            poll_rate_10k = wrk_rate(url, token, polled_job)
            report(("GET /jobs/<id>, 10 unfinished", f"{poll_rate_10:.0f} req/s (wrk, {WRK_CONNECTIONS} connections)"))
            report((
                f"GET /jobs/<id>, {target} unfinished",
                f"{poll_rate_10k:.0f} req/s = {poll_rate_10k / poll_rate_10 - 1:+.0%} (target within 10%)",
            ))
            first_page, fiftieth_page = page_p50s(url, token)
            report(("GET /jobs?state=PENDING, page 1", f"{first_page * 1000:.1f} ms p50 (target <= 20 ms)"))
            report(("GET /jobs?state=PENDING, page 50", f"{fiftieth_page * 1000:.1f} ms p50 (target <= 20 ms)"))

            with sessions() as session, session.begin():
                set_price(session, ANY_GPU_TYPE, 1, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
            started = time.perf_counter()
            billed = run_pass(sessions, slurm_client, settings)
            pass_s = time.perf_counter() - started
            report((
                "billing pass",
                f"{pass_s:.1f} s: {billed.sacct_rows} sacct rows, {billed.ledger_rows} ledger rows (target <= 10 s)",
            ))

            slurm("scancel", f"--account={account}", check=False)
            wait_drained(account)
            api_rate = sustained_rate(api_submit, SUSTAIN_S, SUSTAIN_CONCURRENCY)
            slurm("scancel", f"--account={account}", check=False)
            wait_drained(account)
            sbatch = raw_sbatch(account, job_root)
            raw_rate = sustained_rate(sbatch, SUSTAIN_S, SUSTAIN_CONCURRENCY)
            slurm("scancel", f"--account={account}", check=False)
            report((f"sustained POST /submit, {SUSTAIN_S} s conc. 16", f"{api_rate:.0f} jobs/s"))
            report((f"sustained raw sbatch, {SUSTAIN_S} s conc. 16", f"{raw_rate:.0f} jobs/s ({api_rate / raw_rate:.2f}x)"))
            wait_drained(account)
        engine.dispose()
    table(f"bench/scale ({target} unfinished jobs; MaxJobCount {limit})", rows)


if __name__ == "__main__":
    main()
