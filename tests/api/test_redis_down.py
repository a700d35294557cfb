"""With the rate-limit store (Redis, or its Sentinels) gone, the API counts in its own memory: served, still limited, never a 500 or 503."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.proc import run_command
from gpupool.slurm.client import SlurmClient
from tests.conftest import bearer, create_app_for_tests, wait_for

HELLO = {"template": "hello", "gpus": 1, "params": {"message": "no redis", "seconds": 1}}



@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that takes connections and never answers: a hung or blackholed Redis."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # the kernel completes handshakes; nothing ever reads or writes
        yield listener.getsockname()[1]


def app_with_store(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, uri: str, **limits: str) -> FlaskClient:
    return create_app_for_tests(settings.replace(ratelimit_storage_uri=uri, **limits), slurm, session_factory).test_client()


@pytest.mark.parametrize(
    "uri",
    ["redis://127.0.0.1:{port}/0", "redis+sentinel://127.0.0.1:{port}/mymaster"],
    ids=["redis", "sentinel"],
)
def test_requests_are_served_and_still_limited_per_process(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, closed_port: int, account: str, uri: str
) -> None:
    client = app_with_store(settings, slurm, session_factory, uri.format(port=closed_port), ratelimit_default="3/minute")
    headers = bearer(settings, account, role="admin")
    assert [client.get("/templates", headers=headers).status_code for _ in range(3)] == [200] * 3
    over = client.get("/templates", headers=headers)
    assert over.status_code == 429, over.get_data(as_text=True)
    assert over.get_json()["error"] == "rate_limited"
    assert int(over.headers["Retry-After"]) > 0
    # Another caller has a count of its own.
    assert client.get("/templates", headers=bearer(settings, account, sub="bob")).status_code == 200


def test_a_submit_is_accepted(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, closed_port: int, account: str
) -> None:
    client = app_with_store(settings, slurm, session_factory, f"redis://127.0.0.1:{closed_port}/0")
    reply = client.post("/submit", json=HELLO, headers=bearer(settings, account))
    assert reply.status_code == 201, reply.get_data(as_text=True)
    assert reply.get_json()["slurm_job_id"] > 0


def test_refused_tokens_are_still_counted_per_address(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, closed_port: int
) -> None:
    # Refused tokens are counted in the hook before the limiter's own check: the first to find the store gone.
    client = app_with_store(
        settings, slurm, session_factory, f"redis://127.0.0.1:{closed_port}/0", ratelimit_unauthenticated="2/minute"
    )
    bad = {"Authorization": "Bearer not.a.token"}
    assert [client.get("/jobs", headers=bad).status_code for _ in range(2)] == [401, 401]
    over = client.get("/jobs", headers=bad)
    assert over.status_code == 429, over.get_data(as_text=True)
    assert int(over.headers["Retry-After"]) > 0


def test_health_stays_up(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, closed_port: int) -> None:
    client = app_with_store(settings, slurm, session_factory, f"redis://127.0.0.1:{closed_port}/0")
    assert client.get("/healthz").status_code == 200


def test_a_redis_that_never_answers_is_given_up_on_too(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, silent_port: int, account: str
) -> None:
    hung = settings.replace(ratelimit_storage_uri=f"redis://127.0.0.1:{silent_port}/0", ratelimit_storage_timeout_s=0.2)
    client = create_app_for_tests(hung, slurm, session_factory).test_client()
    # Without a socket timeout this request never returns (the worker is killed: no answer at all).
    assert client.get("/jobs", headers=bearer(settings, account)).status_code == 200
    assert client.get("/jobs").status_code == 401


def redis_cli(port: int, *args: str) -> str:
    return run_command(["redis-cli", "-p", str(port), *args], timeout_s=10, check=False).stdout.strip()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_redis(tmp: Path, port: int, *config: str) -> subprocess.Popen[bytes]:
    """A redis-server of the test's own (Debian's), nothing kept on disk; ``config`` lines added, e.g. Sentinel's."""
    conf = tmp / f"redis-{port}.conf"
    conf.write_text("\n".join([f"port {port}", "bind 127.0.0.1", 'save ""', f"dir {tmp}", *config]) + "\n")
    args = ["/usr/bin/redis-server", str(conf)] + (["--sentinel"] if any(line.startswith("sentinel") for line in config) else [])
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603 - fixed argv
    wait_for(lambda: redis_cli(port, "ping") == "PONG", timeout_s=20, what=f"redis on {port}")
    return server


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[int]:
    """A real Sentinel (redis-server --sentinel) that names the suite's Redis as the master ``gpupool``."""
    port = free_port()
    server = start_redis(tmp_path, port, "sentinel monitor gpupool 127.0.0.1 6379 1")
    yield port
    server.terminate()
    server.wait()


def test_through_a_sentinel_every_host_shares_the_count(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, sentinel: int, account: str
) -> None:
    uri = f"redis+sentinel://127.0.0.1:{sentinel}/gpupool"
    # Two apps are two API hosts: the Sentinel hands both the same master, which counts for both.
    first, second = (app_with_store(settings, slurm, session_factory, uri, ratelimit_default="3/minute") for _ in range(2))
    headers = bearer(settings, account, sub=f"sentinel-{sentinel}")
    assert [first.get("/templates", headers=headers).status_code for _ in range(2)] == [200, 200]
    assert second.get("/templates", headers=headers).status_code == 200
    assert second.get("/templates", headers=headers).status_code == 429


def test_the_api_goes_back_to_redis_when_it_answers_again(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, account: str, tmp_path: Path
) -> None:
    port = free_port()  # nothing listens there yet: the app starts counting in memory
    client = app_with_store(settings, slurm, session_factory, f"redis://127.0.0.1:{port}/0")
    headers = bearer(settings, account)
    assert client.get("/templates", headers=headers).status_code == 200
    server = start_redis(tmp_path, port)
    try:
        def counted_in_redis() -> bool:
            assert client.get("/templates", headers=headers).status_code == 200
            return int(redis_cli(port, "dbsize") or 0) > 0

        # flask-limiter asks the store again after 1, 2, 4... s; the count lands there once it has.
        wait_for(counted_in_redis, timeout_s=40, interval_s=0.5, what="the limiter's counts in the restarted Redis")
    finally:
        server.terminate()
        server.wait()
