"""Shared pieces of the benchmarks: a throwaway database, account, gunicorn and HTTP client."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.support.http import as_service_user_argv, counting_bin_dir, free_port, http
from bench.support.services import add_account_row, create_database, drop_database, throwaway_slurm_account
from bench.support.tenancy import job_root_for_tests, runas_helper
from gpupool import db
from gpupool.config import load_settings
from gpupool.proc import run_command
from gpupool.slurm.client import SlurmClient
from gpupool.tokens import issue_token

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
REDIS_URL = os.environ.get("GPUPOOL_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
SECRET = secrets.token_urlsafe(48)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def slurm(*argv: str, check: bool = True) -> str:
    return run_command(list(argv), timeout_s=60, env={"PATH": "/usr/bin:/bin", "TZ": "UTC"}, check=check).stdout


def require_wrk(bench: str) -> str:
    """wrk's path, or the bench stops at once saying how to install it (before any set-up it would waste)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        sys.exit(f"{bench} needs wrk: apt-get install wrk (make bench installs it)")
    return wrk


def table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    print(f"\n{title}\n" + "-" * len(title))
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


@contextmanager
def filled_database(script: str, values: dict[str, int]) -> Iterator[tuple[str, db.Engine]]:
    """A throwaway migrated PostgreSQL database whose rows ``script`` makes inside it (its statements
    split at ``;``, with ``values`` bound), as (URL, engine); dropped afterwards."""
    name = f"gpupool_bench_{secrets.token_hex(4)}"
    url = create_database(name)
    try:
        engine = db.make_engine(url)
        try:
            with engine.begin() as connection:
                for statement in filter(str.strip, script.split(";")):
                    connection.execute(text(statement), values)
            yield url, engine
        finally:
            engine.dispose()
    finally:
        drop_database(name)


@contextmanager
def bench_env(tmp: Path, *, slurm_gpu_limit: int = 4, runas_env: Mapping[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """A database, a Slurm account, a token; torn down afterwards.

    ``slurm_gpu_limit=0`` keeps every job pending (AssocGrpGRES), for benches
    that time submission alone without job launches competing for the CPUs.
    ``runas_env``: settings of the run-as helper (GPUPOOL_STORAGE_ROOT for bench/files).
    """
    name = f"gpupool_bench_{secrets.token_hex(4)}"
    url = create_database(name)
    settings = load_settings(environ={}, overrides={"jwt_secret": SECRET})
    wrappers, calls = counting_bin_dir(tmp)
    try:
        with (
            job_root_for_tests() as job_root,
            runas_helper(job_root, tmp, runas_env) as runas_socket,
            throwaway_slurm_account(SlurmClient(settings), "b", slurm_gpu_limit) as account,
        ):
            engine = db.make_engine(url)
            sessions = db.make_session_factory(engine)
            add_account_row(sessions, account)
            with sessions() as session, session.begin():
                token = issue_token(session, settings, sub=f"bench-{secrets.token_hex(3)}", account=account, ttl_s=3600)
            engine.dispose()
            yield {
                "database_url": url,
                "account": account,
                "token": token,
                "wrappers": wrappers,
                "calls": calls,
                "job_root": job_root,
                "runas_socket": runas_socket,
            }
    finally:
        drop_database(name)


@contextmanager
def gunicorn(env_info: dict[str, Any], *, workers: int, threads: int = 1, **settings: str) -> Iterator[str]:
    port = free_port()
    env = {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "GPUPOOL_DATABASE_URL": env_info["database_url"],
        "GPUPOOL_JWT_SECRET": SECRET,
        "GPUPOOL_RATELIMIT_STORAGE_URI": REDIS_URL,
        "GPUPOOL_RATELIMIT_DEFAULT": "100000000/minute",
        "GPUPOOL_RATELIMIT_SUBMIT": "100000000/minute",
        "GPUPOOL_TEMPLATES_DIR": str(REPO / "slurm_templates"),
        "GPUPOOL_JOB_ROOT": str(env_info["job_root"]),
        "GPUPOOL_RUNAS_SOCKET": env_info["runas_socket"],
    }
    env.update({f"GPUPOOL_{key.upper()}": value for key, value in settings.items()})
    argv = [str(BIN / "gunicorn"), "--workers", str(workers), "--bind", f"127.0.0.1:{port}", "--log-level", "warning"]
    if threads > 1:
        argv += ["--worker-class", "gthread", "--threads", str(threads)]
    # As production runs it: the unprivileged service user, submitting through the run-as helper.
    process = subprocess.Popen(
        [*as_service_user_argv(), *argv, "api:create_app()"], cwd=REPO, env=env, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if http("GET", url + "/healthz").status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def run_workers(worker: Callable[[], None], concurrency: int) -> float:
    """Seconds for ``concurrency`` threads to run ``worker`` to its end, started together."""
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started
