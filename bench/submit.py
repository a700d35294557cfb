"""bench/submit: POST /submit under gunicorn against raw `sbatch` and slurmrestd, side by side.

Three ways to submit the same rendered hello job (1 GPU) as the account's tenant user:

- raw ``sbatch --parsable``, started as the tenant (the floor: gpupool's own submit runs sbatch);
- slurmrestd, Slurm's REST daemon, run as the tenant with local socket authentication
  (``POST /slurm/v0.0.38/job/submit``), the service an operator could expose instead;
- gpupool's ``POST /submit`` under gunicorn (as many sync workers as the playbook starts,
  as the service user, through the run-as helper), with every guarantee at work: an
  Idempotency-Key on each request and a prepaid credit on the account, so the idempotency
  lookup and the budget check both run.

The bench account's Slurm GPU limit is 0, so every job stays pending: on 2 cores, jobs
starting and ending would otherwise steal CPU from whichever side happens to be timed.
Latency: one at a time, the sides interleaved round by round. Throughput: jobs/s at
concurrency 8, in blocks that alternate between the sides, so a neighbour's load on a
shared machine falls on all three alike. Targets for gpupool: p50 <= 1.5x raw sbatch, and
>= 0.8x raw sbatch's jobs/s at concurrency 8. A second table breaks one submit down by
stage, from the Server-Timing header the API sends with ``server_timing`` on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text, update

from bench._harness import bench_env, gunicorn, median, percentile, run_workers, slurm, table
from bench._profile import (
    HELPER_BUSY,
    HELPER_GROUPS,
    WORKER_BUSY,
    WORKER_GROUPS,
    Component,
    CpuMeter,
    bench_process,
    function_groups,
    parent_of,
    pids_named,
    pids_with_argument,
    py_spy,
    py_spy_binary,
)
from billing.price_book import ANY_GPU_TYPE
from billing.prices import set_price
from gpupool import db
from gpupool.config import load_settings
from gpupool.models import Account
from gpupool.proc import minimal_env, run_command
from gpupool.render import JobSpec, RenderedJob, render
from gpupool.slurm.tenants import Tenant, ensure_tenant_folder, lookup_tenant
from gpupool.templates import load_templates

ROUNDS = 60
CONCURRENCY = 8
CORES = os.cpu_count() or 1
# gpupool_api_workers in deploy/ansible/roles/gpupool_api/defaults/main.yml: as production runs it.
PLAYBOOK_WORKERS = min(CORES * 2 + 1, 9)
BLOCKS = 4
JOBS_PER_BLOCK = 48
PROFILE_ROUNDS = 150
PROFILE_BLOCKS = 4
BODY = {"template": "hello", "gpus": 1, "params": {"message": "bench"}}
SUBMIT_BODY = json.dumps(BODY).encode()
SLURMRESTD = "/usr/sbin/slurmrestd"
RESTD_CLIENT = Path(__file__).resolve().parent / "_restd_client.py"
# Far more than any bench spends: the check runs in full and always passes.
BENCH_CREDIT_NANOS = 10**18
Action = Callable[[], None]


def hello_job(account: str, job_dir: Path, seconds: int = 0) -> RenderedJob:
    hello = load_templates(Path(__file__).resolve().parent.parent / "slurm_templates")["hello"]
    spec = JobSpec(
        job_id=job_dir.name, account=account, name="hello", template="hello",
        body=hello.body, params={"message": "bench", "seconds": seconds}, gpus=1, gpu_type=None, cpus=1, mem_gb=4,
        time_limit_min=60, partition="gpu", job_dir=str(job_dir),
    )
    return render(spec)


def tenant_job_dir(account: str, job_root: Path) -> tuple[Tenant, Path]:
    settings = load_settings(environ={}, overrides={"job_root": str(job_root), "service_group": "gpupool"})
    tenant = lookup_tenant(settings, account)
    return tenant, ensure_tenant_folder(settings, tenant, "00000000-0000-4000-8000-000000000000")


def raw_sbatch(account: str, job_root: Path, *, seconds: int = 0) -> Action:
    """sbatch as the account's tenant user, as the API's jobs run: the floor gpupool is measured against."""
    tenant, job_dir = tenant_job_dir(account, job_root)
    rendered = hello_job(account, job_dir, seconds)
    script = job_dir / "job.sbatch"
    script.write_text(rendered.script)
    shutil.chown(script, tenant.uid, tenant.gid)
    argv = ["/usr/bin/sbatch", "--parsable", *rendered.options, str(script)]

    def submit() -> None:
        run_command(argv, timeout_s=30, env=minimal_env(), run_as=tenant.run_as(), cwd=str(job_dir))

    return submit


def restd_body(account: str, job_dir: Path) -> dict[str, object]:
    """The hello job as slurmrestd's v0.0.38 job description: the same script and the same options."""
    rendered = hello_job(account, job_dir)
    return {
        "script": rendered.script,
        "job": {
            "name": "hello", "account": account, "partition": "gpu", "nodes": 1, "tasks": 1,
            "cpus_per_task": 1, "memory_per_node": 4 * 1024, "gres": "gpu:1", "time_limit": 60,
            "current_working_directory": str(job_dir), "standard_output": str(job_dir / "stdout.log"),
            "standard_error": str(job_dir / "stderr.log"), "comment": f"gpupool:{job_dir.name}",
            "environment": {"PATH": "/usr/bin:/bin"},
        },
    }


class RestdClient:
    """bench/_restd_client.py running as the tenant, driven a line at a time."""

    def __init__(self, process: subprocess.Popen[str], daemon: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.daemon = daemon

    def _ask(self, command: str) -> float:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError("the slurmrestd client stopped; see its stderr above")
        return float(answer)

    def one(self) -> float:
        return self._ask("one")

    def burst(self, jobs: int, concurrency: int) -> float:
        return self._ask(f"burst {jobs} {concurrency}")


@contextmanager
def slurmrestd(account: str, job_root: Path) -> Iterator[RestdClient]:
    """slurmrestd as the tenant on a Unix socket (rest_auth/local), and a client of the same uid."""
    if not os.access(SLURMRESTD, os.X_OK):
        sys.exit("bench/submit needs slurmrestd: apt-get install slurmrestd")
    tenant, job_dir = tenant_job_dir(account, job_root)
    as_tenant = ["setpriv", f"--reuid={tenant.uid}", f"--regid={tenant.gid}", "--clear-groups", "--no-new-privs", "--"]
    folder = Path(tempfile.mkdtemp(prefix="gpupool-restd-", dir="/run" if os.access("/run", os.W_OK) else None))
    os.chown(folder, tenant.uid, tenant.gid)
    socket_path, body_file = folder / "slurmrestd.sock", folder / "job.json"
    body_file.write_text(json.dumps(restd_body(account, job_dir)))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder)}
    with open(folder / "slurmrestd.log", "wb") as log:
        daemon = subprocess.Popen(
            [*as_tenant, SLURMRESTD, "-a", "rest_auth/local", "-s", "openapi/v0.0.38", f"unix:{socket_path}"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    client = subprocess.Popen(
        [*as_tenant, sys.executable, "-I", str(RESTD_CLIENT), str(socket_path), str(body_file)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(folder),
    )
    try:
        deadline = time.monotonic() + 30
        while not socket_path.exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slurmrestd did not start: {(folder / 'slurmrestd.log').read_text()}")
            time.sleep(0.1)
        yield RestdClient(client, daemon)
    finally:
        client.kill()
        client.wait(timeout=30)
        daemon.terminate()
        daemon.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


def give_budget(database_url: str, account: str) -> None:
    """A price and a prepaid credit, so every POST /submit runs the budget check in full."""
    engine = db.make_engine(database_url)
    with db.make_session_factory(engine)() as session, session.begin():
        set_price(session, ANY_GPU_TYPE, 1, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        session.execute(update(Account).where(Account.name == account).values(prepaid_credit_nanos=BENCH_CREDIT_NANOS))
    engine.dispose()


def post_submit(url: str, token: str) -> tuple[int, str, bytes]:
    """POST /submit with a fresh Idempotency-Key on a connection of its own: (status, Server-Timing, body).

    http.client, as the slurmrestd side's client uses: urllib's opener added about
    0.1 ms of the shared CPUs per request, none of it the service's.
    """
    host, _, port = url.removeprefix("http://").partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = {
            "Content-Type": "application/json", "Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4()),
        }
        connection.request("POST", "/submit", body=SUBMIT_BODY, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheader("Server-Timing", ""), response.read()
    finally:
        connection.close()


def timed(action: Action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def burst_seconds(action: Action, jobs: int, concurrency: int) -> float:
    """Seconds for ``jobs`` calls of ``action`` from ``concurrency`` threads."""
    remaining = [jobs]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            action()

    return run_workers(worker, concurrency)


def throughput(action: Action, jobs: int, concurrency: int) -> float:
    return jobs / burst_seconds(action, jobs, concurrency)


def database_backends(database_url: str) -> list[int]:
    """PostgreSQL's backend processes serving the bench database (the workers' pooled connections)."""
    engine = db.make_engine(database_url)
    with engine.connect() as connection:
        pids = connection.execute(
            text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        ).scalars()
        found = list(pids)
    engine.dispose()
    return found


def gunicorn_processes(url: str) -> tuple[int, list[int]]:
    """(the master, every gunicorn process) of the server at ``url``: they all carry its --bind address."""
    pids = pids_with_argument(url.removeprefix("http://"))
    master = next(pid for pid in pids if parent_of(pid) not in pids)
    return master, pids


def cpu_meter(env: dict[str, Any], gunicorn_pids: list[int], restd: RestdClient) -> CpuMeter:
    """Each side's processes: the ones it starts, and the daemons it asks (shared with the whole machine)."""
    fixed = {
        "helper": pids_with_argument(env["runas_socket"]),
        "backends": database_backends(env["database_url"]),
        "redis": pids_named("redis-server"),
        "slurmctld": pids_named("slurmctld"),
        "munged": pids_named("munged"),
    }
    slurm_daemons = [
        Component("slurmctld (shared)", lambda: fixed["slurmctld"]),
        Component("munged, sbatch's credential (shared)", lambda: fixed["munged"]),
    ]
    return CpuMeter(
        {
            "raw": [bench_process(reaped=False), bench_process(reaped=True), *slurm_daemons],
            "restd": [
                Component("the client (bench process)", lambda: [restd.process.pid]),
                Component("slurmrestd", lambda: [restd.daemon.pid]),
                *slurm_daemons,
            ],
            "api": [
                bench_process(reaped=False),
                Component("gunicorn workers", lambda: gunicorn_pids),
                Component("PostgreSQL backends", lambda: fixed["backends"]),
                Component("Redis (shared)", lambda: fixed["redis"]),
                Component("run-as helper", lambda: fixed["helper"]),
                Component("sbatch (as the tenant)", lambda: fixed["helper"], reaped=True),
                *slurm_daemons,
            ],
        }
    )


def per_job_table(meter: CpuMeter, jobs: int, rate: dict[str, float]) -> None:
    rows: list[tuple[str, str]] = []
    for side, label in (("raw", "raw sbatch"), ("restd", "slurmrestd"), ("api", "POST /submit")):
        parts = meter.per_job_ms(side, jobs)
        total = sum(ms for _, ms in parts)
        rows += [(f"{label}: {name}", f"{ms:5.2f} ms") for name, ms in parts]
        rows.append((f"{label}: all", f"{total:5.2f} ms -> at most {CORES * 1000 / total:4.0f} jobs/s on {CORES} cores "
                     f"(measured {rate[side]:.0f})"))
    table(f"CPU per job at concurrency {CONCURRENCY}, by process (/proc; shared daemons include neighbours' work)", rows)


def profile(api_submit: Action, master: int, helper: int, account: str, wall_ms: dict[str, float], cpu_ms: dict[str, float]) -> None:
    """py-spy on the gunicorn workers and the run-as helper, one submit at a time: first wall time, then CPU.

    Shares of the samples become milliseconds through what was measured without py-spy:
    ``wall_ms`` (Server-Timing's total and sbatch stage, medians) and ``cpu_ms`` (/proc, per job).
    """
    with tempfile.TemporaryDirectory(prefix="gpupool-profile-") as folder:
        out = Path(folder)
        for mode in ("wall", "cpu"):
            with (
                py_spy(master, out / f"api-{mode}.txt", idle=mode == "wall", subprocesses=True),
                py_spy(helper, out / f"helper-{mode}.txt", idle=mode == "wall"),
            ):
                time.sleep(1)  # py-spy attaches
                for _ in range(PROFILE_ROUNDS):
                    api_submit()
            slurm("scancel", f"--account={account}", check=False)
        for title, kind, groups, busy, wall_total, cpu_total in (
            ("gunicorn worker", "api", WORKER_GROUPS, WORKER_BUSY, wall_ms["total"], cpu_ms["gunicorn workers"]),
            ("run-as helper", "helper", HELPER_GROUPS, HELPER_BUSY, wall_ms["sbatch"], cpu_ms["run-as helper"]),
        ):
            wall = function_groups(out / f"{kind}-wall.txt", groups, busy)
            cpu = function_groups(out / f"{kind}-cpu.txt", groups, busy)
            names = [name for name, _ in (*groups, ("other", ())) if name in wall or name in cpu]
            rows = [
                (name, f"{wall.get(name, 0.0) * wall_total:5.2f} ms wall ({wall.get(name, 0.0):4.0%})  "
                       f"{cpu.get(name, 0.0) * cpu_total:5.2f} ms CPU ({cpu.get(name, 0.0):4.0%})")
                for name in names
            ]
            rows.append(("all", f"{wall_total:5.2f} ms wall         {cpu_total:5.2f} ms CPU"))
            table(
                f"py-spy, {title}: one submit's wall time (one at a time) and CPU (per job at concurrency "
                f"{CONCURRENCY}, /proc), shared out by {PROFILE_ROUNDS} submits' samples",
                rows,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description="POST /submit against raw sbatch and slurmrestd, side by side.")
    parser.add_argument(
        "--profile", action="store_true",
        help="then sample the gunicorn workers and the run-as helper with py-spy and print where a submit's time goes",
    )
    parser.add_argument(
        "--workers", type=int, default=PLAYBOOK_WORKERS,
        help=f"gunicorn's sync workers (default {PLAYBOOK_WORKERS}: the playbook's min(2 x CPUs + 1, 9) on this machine)",
    )
    args = parser.parse_args()
    if args.profile:
        py_spy_binary()  # before the set-up, not after it
    with tempfile.TemporaryDirectory() as tmp, bench_env(Path(tmp), slurm_gpu_limit=0) as env:
        account, job_root = env["account"], Path(env["job_root"])
        give_budget(env["database_url"], account)
        sbatch = raw_sbatch(account, job_root)
        # Server-Timing on: each submit's answer names its stages (api.metrics.stage).
        with gunicorn(env, workers=args.workers, server_timing="true") as url, slurmrestd(account, job_root) as restd:
            stages: dict[str, list[float]] = {}

            def api_submit() -> None:
                status, timing, body = post_submit(url, env["token"])
                if status != 201:
                    raise RuntimeError(f"submit failed: {status} {body!r}")
                for part in timing.split(","):
                    name, _, ms = part.strip().partition(";dur=")
                    if ms:
                        stages.setdefault(name, []).append(float(ms))

            def restd_submit() -> None:
                restd.one()

            for action in (sbatch, restd_submit, api_submit):  # warm caches, connections, imports
                action()
            latencies: dict[str, list[float]] = {"raw": [], "restd": [], "api": []}
            stages.clear()  # the breakdown is of the interleaved rounds, one submit at a time
            for _ in range(ROUNDS):
                latencies["raw"].append(timed(sbatch))
                latencies["restd"].append(restd.one())
                latencies["api"].append(timed(api_submit))
            breakdown = {name: median(values) for name, values in stages.items()}
            slurm("scancel", f"--account={account}", check=False)
            master, gunicorn_pids = gunicorn_processes(url)
            meter = cpu_meter(env, gunicorn_pids, restd)
            seconds = {"raw": 0.0, "restd": 0.0, "api": 0.0}
            for _ in range(BLOCKS):
                with meter.measure("raw"):
                    seconds["raw"] += burst_seconds(sbatch, JOBS_PER_BLOCK, CONCURRENCY)
                with meter.measure("restd"):
                    seconds["restd"] += restd.burst(JOBS_PER_BLOCK, CONCURRENCY)
                with meter.measure("api"):
                    seconds["api"] += burst_seconds(api_submit, JOBS_PER_BLOCK, CONCURRENCY)
                slurm("scancel", f"--account={account}", check=False)
            jobs = BLOCKS * JOBS_PER_BLOCK
            rate = {side: jobs / spent for side, spent in seconds.items()}
            report(latencies, rate, breakdown, jobs, args.workers)
            per_job_table(meter, jobs, rate)
            if args.profile:
                helper = pids_with_argument(env["runas_socket"])[0]
                profile(api_submit, master, helper, account, breakdown, dict(meter.per_job_ms("api", jobs)))


def report(
    latencies: dict[str, list[float]], rate: dict[str, float], breakdown: dict[str, float], jobs: int, workers: int
) -> None:
    p50 = {side: median(values) for side, values in latencies.items()}

    def latency(side: str) -> str:
        return f"{p50[side] * 1000:5.1f} ms (p90 {percentile(latencies[side], 0.9) * 1000:5.1f} ms)"

    table(
        f"bench/submit ({ROUNDS} interleaved rounds; {jobs} jobs a side at concurrency {CONCURRENCY}, "
        f"{BLOCKS} alternating blocks; gunicorn with {workers} workers; load average {os.getloadavg()[0]:.1f})",
        [
            ("raw sbatch p50", latency("raw")),
            ("slurmrestd p50", latency("restd")),
            ("POST /submit p50", latency("api")),
            ("POST /submit / raw sbatch", f"{p50['api'] / p50['raw']:.2f}x (target <= 1.5)"),
            (f"raw sbatch, conc. {CONCURRENCY}", f"{rate['raw']:.0f} jobs/s"),
            (f"slurmrestd, conc. {CONCURRENCY}", f"{rate['restd']:.0f} jobs/s"),
            (f"POST /submit, conc. {CONCURRENCY}", f"{rate['api']:.0f} jobs/s"),
            ("POST /submit / raw sbatch", f"{rate['api'] / rate['raw']:.2f}x (target >= 0.8)"),
        ],
    )
    total = breakdown.get("total", 0.0)
    outside = total - sum(ms for name, ms in breakdown.items() if name != "total")
    table(
        "POST /submit, one at a time: where a submit's time goes (medians of Server-Timing, ms)",
        [(name, f"{ms:6.2f} ms") for name, ms in breakdown.items() if name != "total"]
        + [
            ("the rest (auth, rate limit, JSON, Flask)", f"{outside:6.2f} ms"),
            ("total in the app", f"{total:6.2f} ms"),
            ("POST /submit p50 at the client", f"{p50['api'] * 1000:6.2f} ms (gunicorn, HTTP, the client)"),
            ("raw sbatch p50", f"{p50['raw'] * 1000:6.2f} ms (the same sbatch, run as the tenant)"),
        ],
    )


if __name__ == "__main__":
    main()
