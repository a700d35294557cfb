"""Fixtures shared by the integration suites: real PostgreSQL, Redis and Slurm.

Each test runs inside an outer PostgreSQL transaction that is rolled back
afterwards; Slurm cannot roll back, so each session makes its own Slurm
account and cancels that account's jobs after every test.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.orm import sessionmaker

from gpupool import db
from gpupool.config import Settings, load_settings
from gpupool.errors import CommandFailed
from gpupool.models import Account
from gpupool.proc import run_command
from gpupool.slurm import SlurmClient
from gpupool.slurm_parse import parse_delimited
from gpupool.tokens import create_token

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("GPUPOOL_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
JWT_SECRET = "test-secret-" + "k" * 40

T = TypeVar("T")


def wait_for(probe: Callable[[], T], *, timeout_s: float = 60, interval_s: float = 0.5, what: str = "condition") -> T:
    """Poll ``probe`` until it returns something truthy; fail with the last value seen."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last value: {last!r}")


def slurm_cmd(*argv: str, check: bool = True) -> str:
    env = {"PATH": "/usr/bin:/bin", "TZ": "UTC", "LANG": "C.UTF-8"}
    return run_command(list(argv), timeout_s=30, env=env, check=check).stdout


def sacct_row(slurm_job_id: int, fields: str = "JobID,Account,AllocTRES,State,ExitCode,ElapsedRaw,Comment") -> dict[str, str]:
    """Slurm's accounting record of one allocation, keyed on sacct's header."""
    rows = parse_delimited(slurm_cmd("sacct", "-X", "-P", "-j", str(slurm_job_id), "-o", fields))
    return rows[0] if rows else {}


def create_database(name: str) -> str:
    admin = create_engine(db.normalize_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    engine = db.make_engine(url)
    db.upgrade(engine)
    engine.dispose()
    return url


def drop_database(name: str) -> None:
    admin = create_engine(db.normalize_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


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
def job_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jobs")


def base_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "jwt_secret": JWT_SECRET,
        "templates_dir": str(REPO / "slurm_templates"),
        "refresh_interval_s": 1.0,
    }
    values.update(overrides)
    return load_settings(environ={}, overrides=values)


@pytest.fixture(scope="session")
def session_settings(pg_url: str, job_root: Path) -> Settings:
    return base_settings(database_url=pg_url, job_root=str(job_root))


@pytest.fixture(scope="session")
def slurm(session_settings: Settings) -> SlurmClient:
    return SlurmClient(session_settings)


def cancel_account_jobs(account: str) -> None:
    slurm_cmd("scancel", f"--account={account}", check=False)

    def drained() -> bool:
        return not slurm_cmd("squeue", "-h", f"--account={account}", "-t", "PENDING,RUNNING,COMPLETING").strip()

    wait_for(drained, timeout_s=60, what=f"jobs of {account} to leave the queue")


@contextmanager
def throwaway_slurm_account(slurm: SlurmClient, prefix: str, gpu_limit: int = 4) -> Iterator[str]:
    """A new Slurm account; its jobs are cancelled and it is deleted afterwards."""
    name = f"{prefix}{secrets.token_hex(4)}"
    slurm.ensure_account(name, gpu_limit)
    try:
        yield name
    finally:
        cancel_account_jobs(name)
        try:
            slurm_cmd("sacctmgr", "-i", "delete", "account", name)
        except CommandFailed:
            pass  # accounts with job records may be kept by slurmdbd; harmless


def add_account_row(session_factory: sessionmaker, name: str) -> None:
    with session_factory() as session, session.begin():
        session.add(Account(name=name, gpu_limit=4))


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


@pytest.fixture
def session_factory(db_connection: Connection) -> sessionmaker:
    return db.make_session_factory(db_connection, join_transaction_mode="create_savepoint")


@pytest.fixture
def account(session_factory: sessionmaker, slurm_account: str) -> Iterator[str]:
    add_account_row(session_factory, slurm_account)
    yield slurm_account
    cancel_account_jobs(slurm_account)


@pytest.fixture
def settings(session_settings: Settings) -> Settings:
    return session_settings


@pytest.fixture
def app(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker) -> Flask:
    return create_app_for_tests(settings, slurm, session_factory)


def create_app_for_tests(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker) -> Flask:
    from api import create_app

    return create_app(settings, slurm=slurm, session_factory=session_factory)


def bearer(settings: Settings, account: str, *, sub: str = "alice", role: str = "customer", ttl_s: int = 3600) -> dict[str, str]:
    return {"Authorization": "Bearer " + create_token(settings, sub=sub, account=account, role=role, ttl_s=ttl_s)}


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
