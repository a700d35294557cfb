"""The service-free app tier: the real Flask app in-process on SQLite, Slurm's answers from recorded outputs.

No PostgreSQL, no Slurm, no run-as helper, no Redis: what depends on none of
them runs here in seconds (the OpenAPI document against the routes, roles
against routes, request schemas and error codes, pagination, the pages'
rendering), and `make check` runs it with lint and the unit tests. Whatever a
real daemon decides (what Slurm accepts, what a job sees, what the database's
triggers and roles refuse) is tested against the real ones in tests/api and
tests/live; a test moves here only when its answer cannot depend on them.

Each test gets a database of its own: a copy of one SQLite file migrated once
per session (a copy is faster than a migration, and no test sees another's rows).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine
from sqlalchemy.orm import sessionmaker
from werkzeug.test import TestResponse

from api import create_app
from gpupool import db
from gpupool.clock import FrozenClock
from gpupool.config import Settings
from gpupool.errors import CommandFailed
from gpupool.models import Account
from gpupool.proc import CommandResult
from gpupool.slurm.client import SlurmClient
from gpupool.tokens import issue_token
from tests.conftest import SUITE_NOW, base_settings

RECORDED = Path(__file__).resolve().parent / "recorded"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
ACCOUNT = "acme"
# What squeue prints for a job-state query with no job: its header, in the caller's delimiter.
_QUEUE_HEADER = ("JOBID", "STATE", "REASON", "SUBMIT_TIME", "START_TIME", "END_TIME", "NODELIST", "USER", "ACCOUNT", "COMMENT")


@dataclass
class RecordedSlurm:
    """Slurm's commands answered from recorded outputs (``recorded/``), every call kept in ``calls``."""

    calls: list[tuple[str, ...]] = field(default_factory=list)

    def __call__(
        self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None, check: bool = True, **_: object
    ) -> CommandResult:
        args = tuple(argv)
        self.calls.append(args)
        command, options = Path(args[0]).name, args[1:]
        if command == "scontrol" and options == ("ping",):
            stdout = (RECORDED / "scontrol-ping.txt").read_text()
        elif command == "sinfo" and "--format=%N|%G|%c|%m" in options:
            stdout = (RECORDED / "sinfo-inventory.txt").read_text()
        elif command == "sinfo":
            stdout = (RECORDED / "sinfo-nodes.txt").read_text()
        elif command == "squeue" and env is not None and "SQUEUE_FORMAT" in env:
            delimiter = env["SQUEUE_FORMAT"][2:-2]  # between %i and %T
            stdout = delimiter.join(_QUEUE_HEADER) + "\n"
        else:
            result = CommandResult(args, 1, "", f"{command}: not recorded for the app tier", 0.0)
            if check:
                raise CommandFailed(args, 1, result.stderr)
            return result
        return CommandResult(args, 0, stdout, "", 0.0)


class NoTenants:
    """The run-as helper's place: nothing in this tier may act as a tenant."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the app tier reached the run-as helper ({name}): move this test to tests/api")


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("app-tier") / "migrated.db"
    engine = db.make_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        db.upgrade(connection, "head")
    engine.dispose()
    return path


@pytest.fixture
def engine(migrated_sqlite: Path, tmp_path: Path) -> Iterator[Engine]:
    path = tmp_path / "app.db"
    shutil.copyfile(migrated_sqlite, path)
    engine = db.make_engine(f"sqlite:///{path}")
    yield engine
    engine.dispose()


@pytest.fixture
def session_factory(engine: Engine) -> sessionmaker:
    factory = db.make_session_factory(engine)
    with factory() as session, session.begin():
        session.add(Account(name=ACCOUNT, gpu_limit=4, unix_user="gp-" + ACCOUNT, unix_uid=200_001))
    return factory


@pytest.fixture
def settings(engine: Engine) -> Settings:
    return base_settings(database_url=str(engine.url), ratelimit_storage_uri="memory://")


@pytest.fixture
def recorded_slurm() -> RecordedSlurm:
    return RecordedSlurm()


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(SUITE_NOW)


@pytest.fixture
def app(settings: Settings, session_factory: sessionmaker, recorded_slurm: RecordedSlurm, clock: FrozenClock) -> Flask:
    slurm = SlurmClient(settings, runner=recorded_slurm, tenants=NoTenants())  # type: ignore[arg-type]
    return create_app(settings, slurm=slurm, session_factory=session_factory, clock=clock)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def auth(settings: Settings, session_factory: sessionmaker) -> dict[str, str]:
    """A customer token of the tier's account, recorded as `gpupool token create` records one."""
    with session_factory() as session, session.begin():
        token = issue_token(session, settings, sub="alice", account=ACCOUNT, role="customer", ttl_s=3600)
    return {"Authorization": "Bearer " + token}


def csrf_of(page: TestResponse) -> str:
    found = CSRF.search(page.get_data(as_text=True))
    assert found, page.get_data(as_text=True)
    return found.group(1)


def signed_in(client: FlaskClient, settings: Settings, session_factory: sessionmaker, role: str = "customer") -> str:
    """The client signed in to the pages as alice of the tier's account; the pages' CSRF value."""
    with session_factory() as session, session.begin():
        token = issue_token(session, settings, sub="alice", account=ACCOUNT, role=role, ttl_s=3600)
    form = client.get("/ui/signin")
    answer = client.post("/ui/signin", data={"csrf_token": csrf_of(form), "token": token})
    assert answer.status_code == 303, answer.get_data(as_text=True)
    return csrf_of(client.get("/ui/jobs"))
