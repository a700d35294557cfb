"""Fixtures shared by the integration suites: real PostgreSQL, Redis and Slurm.

Each test runs inside an outer PostgreSQL transaction that is rolled back
afterwards; Slurm cannot roll back, so each session makes its own Slurm
account and cancels that account's jobs after every test.

Time: every app a test builds in-process takes its calendar ("this month",
budgets, report windows) from a FrozenClock set to ``SUITE_NOW``: the real
time when the run started, or ``GPUPOOL_TEST_NOW`` when it is set (``make
test-calendar`` runs the date-sensitive tests at a month's last second, the
next month's first and 29 February). Fixtures that bill "this month" derive
their dates from ``SUITE_NOW``, never from a literal month.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.orm import sessionmaker

from bench.support.services import (
    add_account_row,
    cancel_account_jobs,
    create_database,
    drop_database,
    slurm_cmd,
    throwaway_slurm_account,
    wait_for,
)
from bench.support.tenancy import job_root_for_tests, runas_helper
from gpupool import db
from gpupool.clock import FrozenClock, parse_instant, system_clock
from gpupool.config import Settings, load_settings
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import parse_delimited
from gpupool.tokens import issue_token

REPO = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("GPUPOOL_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
JWT_SECRET = "test-secret-" + "k" * 40
SUITE_NOW = parse_instant(os.environ["GPUPOOL_TEST_NOW"]) if os.environ.get("GPUPOOL_TEST_NOW") else system_clock().replace(microsecond=0)

# tryfirst: xdist's worker names each test's group from these marks in a hook of its own, registered
# after this file and so called before it; marks added after that were ignored, every test was its own
# group, and each worker built the module fixtures (two full renders each) for itself.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Where each test may run under ``--dist loadgroup`` (make test's CPU-bound half, two workers).

    A module's tests stay on one worker, as with ``--dist loadfile``, so its module-scoped
    fixtures are made once. A module whose slow fixtures only some tests share names them
    in ``XDIST_SHARED_FIXTURES``: the tests that use any of them stay together (a test may
    use two, so one group for all: each fixture is made once), and every other test of the
    module may go to either worker (the playbook render tests, of which a quarter render for
    themselves). Without xdist the mark does nothing.
    """
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module_id = item.nodeid.split("::", 1)[0]
        shared = getattr(getattr(item, "module", None), "XDIST_SHARED_FIXTURES", None)
        if shared is None:
            group = module_id
        else:
            uses_shared = bool(set(getattr(item, "fixturenames", ())) & set(shared))
            group = f"{module_id}::shared" if uses_shared else item.nodeid
        item.add_marker(pytest.mark.xdist_group(group))


def sacct_row(slurm_job_id: int, fields: str = "JobID,Account,AllocTRES,State,ExitCode,ElapsedRaw,Comment") -> dict[str, str]:
    """Slurm's accounting record of one allocation, keyed on sacct's header."""
    rows = parse_delimited(slurm_cmd("sacct", "-X", "-P", "-j", str(slurm_job_id), "-o", fields))
    return rows[0] if rows else {}


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    name = f"gpupool_test_{secrets.token_hex(4)}"
    url = create_database(name)
    yield url
    drop_database(name)


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[Engine]:
    engine = db.make_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def job_root() -> Iterator[Path]:
    with job_root_for_tests() as root:
        yield root


@pytest.fixture(scope="session")
def runas_socket(job_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's run-as helper: every test submit goes through its socket, as in production."""
    with runas_helper(job_root, tmp_path_factory.mktemp("runas")) as socket_path:
        yield socket_path


def base_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "jwt_secret": JWT_SECRET,
        "templates_dir": str(REPO / "slurm_templates"),
        "refresh_interval_s": 1.0,
    }
    values.update(overrides)
    return load_settings(environ={}, overrides=values)


@pytest.fixture(scope="session")
def session_settings(pg_url: str, job_root: Path, runas_socket: str) -> Settings:
    return base_settings(database_url=pg_url, job_root=str(job_root), runas_socket=runas_socket)


@pytest.fixture(scope="session")
def slurm(session_settings: Settings) -> SlurmClient:
    return SlurmClient(session_settings)


@pytest.fixture(scope="session")
def slurm_account(slurm: SlurmClient) -> Iterator[str]:
    """A Slurm account of this test session's own."""
    with throwaway_slurm_account(slurm, "t") as name:
        yield name


@pytest.fixture
def db_connection(pg_engine: Engine) -> Iterator[Connection]:
    connection = pg_engine.connect()
    outer = connection.begin()
    yield connection
    outer.rollback()
    connection.close()


# The running test's rolled-back session factory, if it has one: recorded_token()
# writes there, so a test's tokens vanish with its other rows.
_test_session_factories: list[sessionmaker] = []


@pytest.fixture
def session_factory(db_connection: Connection) -> Iterator[sessionmaker]:
    factory = db.make_session_factory(db_connection, join_transaction_mode="create_savepoint")
    _test_session_factories.append(factory)
    yield factory
    _test_session_factories.remove(factory)


@pytest.fixture
def account(session_factory: sessionmaker, slurm_account: str) -> Iterator[str]:
    add_account_row(session_factory, slurm_account)
    yield slurm_account
    cancel_account_jobs(slurm_account)


@pytest.fixture
def settings(session_settings: Settings) -> Settings:
    return session_settings


@pytest.fixture
def clock() -> FrozenClock:
    """The calendar of the test's app: SUITE_NOW, which the test may move."""
    return FrozenClock(SUITE_NOW)


@pytest.fixture
def app(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, clock: FrozenClock) -> Flask:
    return create_app_for_tests(settings, slurm, session_factory, clock=clock)


def create_app_for_tests(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, *, clock: FrozenClock | None = None
) -> Flask:
    from api import create_app

    return create_app(settings, slurm=slurm, session_factory=session_factory, clock=clock or FrozenClock(SUITE_NOW))


def recorded_token(settings: Settings, account: str, *, sub: str = "alice", role: str = "customer", ttl_s: int = 3600) -> str:
    """A token the API accepts: signed and recorded, as `gpupool token create` does.

    Recorded through the running test's rolled-back session factory when it has
    one, otherwise committed to ``settings.database_url`` (tests that own their database).
    """
    if _test_session_factories:
        with _test_session_factories[-1]() as session, session.begin():
            return issue_token(session, settings, sub=sub, account=account, role=role, ttl_s=ttl_s)
    engine = db.make_engine(settings.database_url)
    try:
        with db.make_session_factory(engine)() as session, session.begin():
            return issue_token(session, settings, sub=sub, account=account, role=role, ttl_s=ttl_s)
    finally:
        engine.dispose()


def bearer(settings: Settings, account: str, *, sub: str = "alice", role: str = "customer", ttl_s: int = 3600) -> dict[str, str]:
    return {"Authorization": "Bearer " + recorded_token(settings, account, sub=sub, role=role, ttl_s=ttl_s)}


@pytest.fixture
def auth(settings: Settings, account: str) -> dict[str, str]:
    return bearer(settings, account)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def wait_for_state(client: FlaskClient, job_id: str, headers: dict[str, str], states: set[str], *, timeout_s: float = 60) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        body = client.get(f"/jobs/{job_id}", headers=headers).get_json()
        done = body["state"] in states and (body["state"] in ("PENDING", "RUNNING") or body["exit_code"] is not None)
        return body if done else None

    return wait_for(probe, timeout_s=timeout_s, what=f"job {job_id} to reach {sorted(states)}")


def new_uuid() -> str:
    return str(uuid.uuid4())


def utc(text_value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text_value.replace("Z", "+00:00"))


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on: bound and never listened to, so connects are refused."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]
