"""With the rate-limit store (Redis) unreachable, every request that needs it gets 503 JSON, never a 500."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from tests.conftest import bearer, create_app_for_tests

UNAVAILABLE = {"error": "rate_limit_unavailable", "message": "the rate-limit store is not answering; retry shortly"}


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on: bound and never listened to, so connects are refused."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that takes connections and never answers: a hung or blackholed Redis."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # the kernel completes handshakes; nothing ever reads or writes
        yield listener.getsockname()[1]


@pytest.fixture
def redis_down(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, closed_port: int) -> FlaskClient:
    down = settings.replace(ratelimit_storage_uri=f"redis://127.0.0.1:{closed_port}/0")
    return create_app_for_tests(down, slurm, session_factory).test_client()


def assert_unavailable(reply: object) -> None:
    assert reply.status_code == 503, reply.get_data(as_text=True)  # type: ignore[attr-defined]
    assert reply.get_json() == UNAVAILABLE  # type: ignore[attr-defined]
    assert reply.headers["Retry-After"] == "5"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/jobs", None),
        ("GET", "/templates", None),
        ("POST", "/submit", {"template": "hello", "gpus": 1}),
        ("GET", "/webhooks", None),
        ("GET", "/usage", None),
        ("GET", "/admin/report?period=2026-11", None),
    ],
)
def test_an_authenticated_request_gets_503_json(
    redis_down: FlaskClient, settings: Settings, account: str, method: str, path: str, body: object
) -> None:
    reply = redis_down.open(path, method=method, json=body, headers=bearer(settings, account, role="admin"))
    assert_unavailable(reply)


def test_a_request_without_a_valid_token_gets_503_json(redis_down: FlaskClient) -> None:
    # Refused tokens are counted per address in the store too: no store, no answer but 503.
    assert_unavailable(redis_down.get("/jobs"))
    assert_unavailable(redis_down.get("/jobs", headers={"Authorization": "Bearer not.a.token"}))


def test_health_stays_up(redis_down: FlaskClient) -> None:
    assert redis_down.get("/healthz").status_code == 200



def test_a_redis_that_never_answers_gets_503_json_too(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, silent_port: int, account: str
) -> None:
    hung = settings.replace(ratelimit_storage_uri=f"redis://127.0.0.1:{silent_port}/0", ratelimit_storage_timeout_s=0.2)
    client = create_app_for_tests(hung, slurm, session_factory).test_client()
    # Without a socket timeout this request never returns (the worker is killed: no answer at all).
    assert_unavailable(client.get("/jobs", headers=bearer(settings, account)))
    assert_unavailable(client.get("/jobs"))
