"""The service as operators run it: gunicorn with 4 workers, Redis, PostgreSQL, Slurm."""

from __future__ import annotations

import os
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bench.support.http import counting_bin_dir, slurm_calls
from bench.support.services import PG_ADMIN_URL
from gpupool import db
from gpupool.config import Settings
from tests.conftest import REDIS_URL, REPO, base_settings, recorded_token, slurm_cmd, wait_for
from tests.live.conftest import Server, http

HELLO = {"template": "hello", "gpus": 1, "params": {"message": "hi", "seconds": 0}}


@pytest.fixture
def settings(live_db: str) -> Settings:
    """The servers' database: tokens are recorded where the API looks them up."""
    return base_settings(database_url=f"postgresql://postgres@127.0.0.1:5432/{live_db}")


def token_for(settings: Settings, account: str) -> str:
    # A fresh subject per test, so rate-limit counters in Redis never carry over.
    return recorded_token(settings, account, sub=f"user-{secrets.token_hex(4)}")


def test_rate_limit_holds_across_four_workers(
    start_server: Callable[..., Server], settings: Settings, slurm_account: str
) -> None:
    server = start_server(ratelimit_default="20/minute", ratelimit_submit="3/minute")
    token = token_for(settings, slurm_account)
    statuses = [http("GET", server.url + "/templates", token=token).status for _ in range(20)]
    assert statuses == [200] * 20
    over = http("GET", server.url + "/templates", token=token)
    assert over.status == 429
    assert over.body["error"] == "rate_limited"
    assert int(over.headers["Retry-After"]) > 0
    # Each worker keeps its own pid; more than one must have served for this to mean anything.
    assert len(set(_worker_pids(server))) == 4

    submitter = token_for(settings, slurm_account)
    bad = {"template": "no-such-template"}
    assert [http("POST", server.url + "/submit", token=submitter, body=bad).status for _ in range(3)] == [422] * 3
    limited = http("POST", server.url + "/submit", token=submitter, body=bad)
    assert limited.status == 429 and "Retry-After" in limited.headers
    # Another caller is counted separately.
    assert http("GET", server.url + "/templates", token=token_for(settings, slurm_account)).status == 200


def _worker_pids(server: Server) -> list[int]:
    out = slurm_cmd("pgrep", "-P", str(server.process.pid))
    return [int(pid) for pid in out.split()]


def test_rate_limit_storage_down_degrades_to_per_worker_limits(
    start_server: Callable[..., Server], settings: Settings, slurm_account: str
) -> None:
    server = start_server(ratelimit_storage_uri="redis://127.0.0.1:1/0")
    token = token_for(settings, slurm_account)
    reply = http("POST", server.url + "/submit", token=token, body=HELLO)
    assert reply.status == 201, reply.body
    try:
        assert http("GET", server.url + "/healthz").status == 200
        listed = slurm_cmd("squeue", "-h", f"--account={slurm_account}", "-o", "%i").split()
        assert listed == [str(reply.body["slurm_job_id"])]
    finally:
        http("DELETE", f"{server.url}/jobs/{reply.body['job_id']}", token=token)


def test_a_submit_records_slurms_job_id_on_its_row_before_it_answers(
    start_server: Callable[..., Server], settings: Settings, slurm_account: str
) -> None:
    """The row a worker's own connection wrote (in autocommit, past the request's transaction), read before any GET refreshes it."""
    server = start_server()
    token = token_for(settings, slurm_account)
    headers = {"Idempotency-Key": secrets.token_hex(8)}
    body = {**HELLO, "params": {"seconds": 60}}
    submitted = http("POST", server.url + "/submit", token=token, body=body, headers=headers)
    assert submitted.status == 201, submitted.body
    job_id, slurm_job_id = submitted.body["job_id"], submitted.body["slurm_job_id"]
    try:
        engine = db.make_engine(settings.database_url)
        with engine.connect() as connection:
            row = connection.execute(
                text("SELECT slurm_job_id, state, submitted_at IS NOT NULL FROM jobs WHERE id = :id"), {"id": job_id}
            ).one()
        engine.dispose()
        assert tuple(row) == (slurm_job_id, "PENDING", True)
        assert slurm_cmd("squeue", "-h", "-j", str(slurm_job_id), "-o", "%k").strip() == f"gpupool:{job_id}"
        # The same key again: the same job, from that row, and no second one in Slurm.
        again = http("POST", server.url + "/submit", token=token, body=body, headers=headers)
        assert (again.status, again.headers.get("Idempotent-Replayed"), again.body["slurm_job_id"]) == (201, "true", slurm_job_id)
        assert slurm_cmd("squeue", "-h", f"--account={slurm_account}", "-o", "%k").split().count(f"gpupool:{job_id}") == 1
    finally:
        http("DELETE", f"{server.url}/jobs/{job_id}", token=token)


def test_slurm_calls_do_not_grow_with_pollers(
    start_server: Callable[..., Server], settings: Settings, slurm_account: str, tmp_path: Path
) -> None:
    wrappers, calls = counting_bin_dir(tmp_path)
    server = start_server(slurm_bin_dir=str(wrappers), refresh_interval_s="1", ratelimit_default="1000000/minute")
    token = token_for(settings, slurm_account)
    job = http("POST", server.url + "/submit", token=token, body={**HELLO, "params": {"seconds": 60}}).body
    wait_for(lambda: http("GET", f"{server.url}/jobs/{job['job_id']}", token=token).body["state"] == "RUNNING", what="RUNNING")

    calls.write_text("")
    polls = 0
    wrong: list[object] = []
    lock = threading.Lock()
    duration_s = 6.0
    stop_at = time.monotonic() + duration_s

    def poll() -> None:
        nonlocal polls
        while time.monotonic() < stop_at:
            reply = http("GET", f"{server.url}/jobs/{job['job_id']}", token=token)
            with lock:
                polls += 1
                if reply.status != 200 or reply.body["state"] != "RUNNING":
                    wrong.append(reply.body)

    threads = [threading.Thread(target=poll) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queries = slurm_calls(calls, "squeue", "sacct")
    assert wrong == []
    assert polls > 100  # the load was real
    assert 1 <= queries <= duration_s / 1 + 2, f"{queries} Slurm queries for {polls} polls"
    http("DELETE", f"{server.url}/jobs/{job['job_id']}", token=token)


class Controller:
    """SIGSTOP slurmctld: it keeps its sockets but answers nothing, like a hung controller."""

    def __init__(self) -> None:
        # The local cluster's controller by its pid file: in .ci/run the fresh-host and real-hosts
        # tiers run their own slurmctld beside it, visible to pgrep from here.
        config = slurm_cmd("scontrol", "show", "config")
        pid_file = re.search(r"^SlurmctldPidFile\s*=\s*(\S+)$", config, re.MULTILINE)
        assert pid_file, "scontrol show config names no SlurmctldPidFile"
        self.pid = int(Path(pid_file.group(1)).read_text().split()[0])
        assert Path(f"/proc/{self.pid}/comm").read_text().strip() == "slurmctld"
        self.stopped = False

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        if self.stopped:
            os.kill(self.pid, signal.SIGCONT)
            self.stopped = False


@pytest.fixture
def slurmctld() -> Iterator[Controller]:
    controller = Controller()
    try:
        yield controller
    finally:
        controller.resume()
        wait_for(lambda: "UP" in slurm_cmd("scontrol", "ping", check=False), what="slurmctld to answer again")


def test_hung_slurmctld_gives_503_and_no_duplicate_after_recovery(
    start_server: Callable[..., Server], settings: Settings, slurm_account: str, slurmctld: Controller
) -> None:
    server = start_server(workers=1)
    token = token_for(settings, slurm_account)
    # A first job warms the worker's cached cluster shape, so the next submit gets as far as sbatch.
    assert http("POST", server.url + "/submit", token=token, body=HELLO).status == 201
    headers = {"Idempotency-Key": f"retry-{secrets.token_hex(4)}"}
    slurmctld.stop()
    # The client gives up after 15 s: an answer later than that fails the test.
    reply = http("POST", server.url + "/submit", token=token, body=HELLO, headers=headers, timeout_s=15)
    assert reply.status == 503, reply.body
    assert reply.body["error"] == "slurm_unavailable"
    assert "Idempotency-Key" in reply.body["message"]
    job_id = reply.body["job_id"]
    assert http("GET", server.url + "/readyz", timeout_s=15).status == 503
    cold = start_server(workers=1)  # a worker that never saw the cluster answers 503 too
    assert http("POST", cold.url + "/submit", token=token, body=HELLO, timeout_s=15).status == 503

    slurmctld.resume()
    wait_for(lambda: http("GET", server.url + "/readyz").status == 200, what="readyz to recover")
    retried = wait_for(
        lambda: (r := http("POST", server.url + "/submit", token=token, body=HELLO, headers=headers)).status == 201 and r,
        what="the retried submit to be accepted",
        timeout_s=120,
    )
    assert retried.body["job_id"] == job_id
    done = wait_for(
        lambda: (b := http("GET", f"{server.url}/jobs/{job_id}", token=token).body)["state"] == "COMPLETED" and b["exit_code"] is not None and b,
        what="COMPLETED",
    )

    def tagged() -> list[str]:
        rows = slurm_cmd("sacct", "-X", "-n", "-P", "-a", "-S", "now-1hour", f"--accounts={slurm_account}", "-o", "Comment,JobID")
        return [row for row in rows.split() if row.startswith(f"gpupool:{job_id}|")]

    # slurmdbd records jobs asynchronously; wait for it, then count.
    assert wait_for(tagged, what="sacct to list the job") == [f"gpupool:{job_id}|{done['slurm_job_id']}"]

    for url in (server.url, cold.url):
        fresh = http("POST", url + "/submit", token=token, body=HELLO)
        assert fresh.status == 201 and fresh.body["job_id"] != job_id


def _set_connections(database: str, allowed: bool) -> None:
    admin = create_engine(db.normalize_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {"true" if allowed else "false"}'))
        if not allowed:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"), {"d": database})
    admin.dispose()


def test_database_down_gives_503_then_recovers(
    start_server: Callable[..., Server], settings: Settings, slurm_account: str, live_db: str
) -> None:
    server = start_server(workers=2)
    token = token_for(settings, slurm_account)
    assert http("GET", server.url + "/jobs", token=token).status == 200
    _set_connections(live_db, False)
    try:
        for path in ("/jobs", "/readyz"):
            reply = http("GET", server.url + path, token=token)
            assert reply.status == 503, reply.body
        assert http("GET", server.url + "/jobs", token=token).body["error"] == "database_unavailable"
        assert http("POST", server.url + "/submit", token=token, body=HELLO).status == 503
    finally:
        _set_connections(live_db, True)
    assert wait_for(lambda: http("GET", server.url + "/jobs", token=token).status == 200, what="recovery")


def test_service_refuses_an_unmigrated_database(start_server: Callable[..., Server], tmp_path: Path) -> None:
    empty = f"sqlite:///{tmp_path}/empty.db"
    server = start_server(database_url=empty, wait=False, workers=1)
    assert server.process.wait(timeout=60) != 0
    assert "run `gpupool db upgrade` first" in server.log()


def _slurmctld_service(action: str) -> None:
    # The playbook's stand-in for systemd where systemd is not PID 1.
    helper = Path("/usr/local/sbin/gpupool-daemon")
    argv = [str(helper), action, "slurmctld"] if helper.exists() else ["systemctl", action, "slurmctld"]
    slurm_cmd(*argv)


@pytest.fixture
def stoppable_slurmctld() -> Iterator[Callable[[str], None]]:
    try:
        yield _slurmctld_service
    finally:
        _slurmctld_service("start")
        wait_for(lambda: "UP" in slurm_cmd("scontrol", "ping", check=False), what="slurmctld to answer again")
        wait_for(
            lambda: slurm_cmd("sinfo", "-h", "-o", "%t").strip() in ("idle", "mix", "alloc"),
            what="the node to be back in service",
        )


def test_stopped_slurmctld_gives_503_then_works_without_a_restart(
    start_server: Callable[..., Server], settings: Settings, slurm_account: str,
    stoppable_slurmctld: Callable[[str], None],
) -> None:
    server = start_server(workers=1)
    token = token_for(settings, slurm_account)
    assert http("POST", server.url + "/submit", token=token, body=HELLO).status == 201
    stoppable_slurmctld("stop")
    reply = http("POST", server.url + "/submit", token=token, body=HELLO, timeout_s=15)
    assert reply.status == 503, reply.body
    assert reply.body["error"].startswith("slurm")
    assert reply.headers["Retry-After"] == "5"
    listed = http("GET", server.url + "/jobs", token=token)
    assert listed.status == 200  # known states are still served while Slurm is away

    stoppable_slurmctld("start")
    accepted = wait_for(
        lambda: (r := http("POST", server.url + "/submit", token=token, body=HELLO)).status == 201 and r,
        what="submits to work again",
    )
    done = wait_for(
        lambda: (b := http("GET", f"{server.url}/jobs/{accepted.body['job_id']}", token=token).body)["state"] == "COMPLETED" and b,
        what="the new job to complete",
    )
    assert done["exit_code"] == 0


def test_gunicorn_reads_a_config_file_named_by_gpupool_config(
    start_server: Callable[..., Server],
    settings: Settings,
    slurm_account: str,
    live_db: str,
    tmp_path: Path,
    job_root: Path,
    runas_socket: str,
) -> None:
    config = tmp_path / "gpupool.toml"
    config.write_text(
        f"""
database_url = "postgresql://postgres@127.0.0.1:5432/{live_db}"
jwt_secret = "{settings.jwt_secret}"
ratelimit_storage_uri = "{REDIS_URL}"
ratelimit_default = "3/minute"
slurm_bin_dir = "/usr/bin"
templates_dir = "{REPO / 'slurm_templates'}"
job_root = "{job_root}"
runas_socket = "{runas_socket}"
"""
    )
    server = start_server(config_file=config, workers=2)
    assert http("GET", server.url + "/readyz").status == 200
    token = token_for(settings, slurm_account)
    assert [http("GET", server.url + "/jobs", token=token).status for _ in range(4)] == [200, 200, 200, 429]
