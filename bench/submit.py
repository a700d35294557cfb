"""bench/submit: POST /submit under gunicorn against raw `sbatch` and slurmrestd, side by side.

Three ways to submit the same rendered hello job (1 GPU) as the account's tenant user:

- raw ``sbatch --parsable``, started as the tenant (the floor: gpupool's own submit runs sbatch);
- slurmrestd, Slurm's REST daemon, run as the tenant with local socket authentication
  (``POST /slurm/v0.0.38/job/submit``), the service an operator could expose instead;
- gpupool's ``POST /submit`` under gunicorn (4 workers, as the service user, through the
  run-as helper), with every guarantee at work: an Idempotency-Key on each request and a
  prepaid credit on the account, so the idempotency lookup and the budget check both run.

The bench account's Slurm GPU limit is 0, so every job stays pending: on 2 cores, jobs
starting and ending would otherwise steal CPU from whichever side happens to be timed.
Latency: one at a time, the sides interleaved round by round. Throughput: jobs/s at
concurrency 8, in blocks that alternate between the sides, so a neighbour's load on a
shared machine falls on all three alike. Targets for gpupool: p50 <= 1.5x raw sbatch, and
>= 0.8x raw sbatch's jobs/s at concurrency 8. A second table breaks one submit down by
stage, from the Server-Timing header the API sends with ``server_timing`` on.
"""

from __future__ import annotations

import datetime as dt
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

from sqlalchemy import update

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import bench_env, gunicorn, http, median, percentile, slurm, table  # noqa: E402
from billing.price_book import ANY_GPU_TYPE  # noqa: E402
from billing.prices import set_price  # noqa: E402
from gpupool import db  # noqa: E402
from gpupool.config import load_settings  # noqa: E402
from gpupool.models import Account  # noqa: E402
from gpupool.proc import minimal_env, run_command  # noqa: E402
from gpupool.render import JobSpec, RenderedJob, render  # noqa: E402
from gpupool.slurm.tenants import Tenant, ensure_tenant_folder, lookup_tenant  # noqa: E402
from gpupool.templates import load_templates  # noqa: E402

ROUNDS = 60
CONCURRENCY = 8
BLOCKS = 4
JOBS_PER_BLOCK = 48
BODY = {"template": "hello", "gpus": 1, "params": {"message": "bench"}}
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

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

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
        yield RestdClient(client)
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

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def throughput(action: Action, jobs: int, concurrency: int) -> float:
    return jobs / burst_seconds(action, jobs, concurrency)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, bench_env(Path(tmp), slurm_gpu_limit=0) as env:
        account, job_root = env["account"], Path(env["job_root"])
        give_budget(env["database_url"], account)
        sbatch = raw_sbatch(account, job_root)
        # Server-Timing on: each submit's answer names its stages (api.metrics.stage).
        with gunicorn(env, workers=4, server_timing="true") as url, slurmrestd(account, job_root) as restd:
            stages: dict[str, list[float]] = {}

            def api_submit() -> None:
                headers = {"Idempotency-Key": str(uuid.uuid4())}
                reply = http("POST", url + "/submit", token=env["token"], body=BODY, headers=headers)
                if reply.status != 201:
                    raise RuntimeError(f"submit failed: {reply.status} {reply.body}")
                for part in reply.headers.get("Server-Timing", "").split(","):
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
            seconds = {"raw": 0.0, "restd": 0.0, "api": 0.0}
            for _ in range(BLOCKS):
                seconds["raw"] += burst_seconds(sbatch, JOBS_PER_BLOCK, CONCURRENCY)
                seconds["restd"] += restd.burst(JOBS_PER_BLOCK, CONCURRENCY)
                seconds["api"] += burst_seconds(api_submit, JOBS_PER_BLOCK, CONCURRENCY)
                slurm("scancel", f"--account={account}", check=False)
    jobs = BLOCKS * JOBS_PER_BLOCK
    rate = {side: jobs / spent for side, spent in seconds.items()}
    p50 = {side: median(values) for side, values in latencies.items()}

    def latency(side: str) -> str:
        return f"{p50[side] * 1000:5.1f} ms (p90 {percentile(latencies[side], 0.9) * 1000:5.1f} ms)"

    table(
        f"bench/submit ({ROUNDS} interleaved rounds; {jobs} jobs a side at concurrency {CONCURRENCY}, "
        f"{BLOCKS} alternating blocks)",
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
