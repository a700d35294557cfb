"""The database gone or read-only (a failover under way): 503 JSON with Retry-After, never 500; /readyz not ready.

Each app here runs on a database of the module's own, committed (not the suite's
rolled-back transaction): what a second connection sees is what the API sees.
A read-only database is PostgreSQL's own ``default_transaction_read_only`` given
to the app's connections, as a demoted leader or a standby refuses writes
(SQLSTATE 25006). A database that is gone is a port nothing listens on.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import sessionmaker

from bench.support.services import add_account_row, cancel_account_jobs, create_database, drop_database
from gpupool import db
from gpupool.config import Settings
from gpupool.jobstate import JobStateRefresher
from gpupool.models import Job
from gpupool.models.jobs import SUBMITTING
from gpupool.render import job_tag
from gpupool.slurm.client import SlurmClient
from tests.conftest import bearer, create_app_for_tests, slurm_cmd

HELLO = {"template": "hello", "gpus": 1, "params": {"message": "failover", "seconds": 1}}


@pytest.fixture(scope="module")
def own_url(slurm_account: str) -> Iterator[str]:
    """A migrated database of this module's own, holding the account's row, committed."""
    name = f"gpupool_dbdown_{secrets.token_hex(4)}"
    url = create_database(name)
    engine = db.make_engine(url)
    add_account_row(db.make_session_factory(engine), slurm_account)
    engine.dispose()
    yield url
    drop_database(name)


@pytest.fixture
def own_settings(settings: Settings, own_url: str) -> Settings:
    return settings.replace(database_url=own_url)


@pytest.fixture
def token(own_settings: Settings, slurm_account: str) -> dict[str, str]:
    """A token recorded in the module's database (no rolled-back session is open in these tests)."""
    return bearer(own_settings, slurm_account, role="admin")



def app_on(settings: Settings, slurm: SlurmClient, engine: Engine) -> FlaskClient:
    return create_app_for_tests(settings, slurm, db.make_session_factory(engine)).test_client()


def assert_database_unavailable(reply: Any) -> None:
    assert reply.status_code == 503, reply.get_data(as_text=True)
    body = reply.get_json()
    assert body["error"] == "database_unavailable"
    assert body["message"] == "the database is not answering or not taking writes; retry shortly"
    assert reply.headers["Retry-After"] == "5"


def account_queue(account: str) -> list[str]:
    """The account's jobs in Slurm, as ``<id>|<comment>`` lines."""
    return slurm_cmd("squeue", "-h", f"--account={account}", "-o", "%i|%k").split()


def test_a_database_that_is_gone_answers_503_json_and_readyz_not_ready(
    own_settings: Settings, slurm: SlurmClient, token: dict[str, str], closed_port: int
) -> None:
    # The app's pool points at the database's address, where nothing answers any more.
    gone = db.make_engine(f"postgresql://postgres@127.0.0.1:{closed_port}/gpupool", connect_args={"connect_timeout": 2})
    client = app_on(own_settings, slurm, gone)
    assert_database_unavailable(client.get("/jobs", headers=token))
    assert_database_unavailable(client.post("/submit", json=HELLO, headers=token))
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.get_json()["checks"]["database"] == "unavailable: OperationalError"
    assert client.get("/healthz").status_code == 200


def test_a_host_list_reaches_the_host_that_answers(
    own_settings: Settings, own_url: str, slurm: SlurmClient, token: dict[str, str], closed_port: int
) -> None:
    # libpq's multi-host URL, the first host gone: libpq tries the next, as after a failover.
    listed = own_url.replace("@127.0.0.1:5432/", f"@127.0.0.1:{closed_port},127.0.0.1:5432/") + "?target_session_attrs=read-write"
    assert listed != own_url
    client = app_on(own_settings.replace(database_url=listed), slurm, db.make_engine(listed))
    assert client.get("/jobs", headers=token).status_code == 200
    assert client.get("/readyz").get_json()["checks"]["database"] == "ok"


def test_a_read_only_database_refuses_the_submit_with_503_before_sbatch(
    own_settings: Settings, own_url: str, slurm: SlurmClient, slurm_account: str, token: dict[str, str]
) -> None:
    read_only = db.make_engine(own_url, connect_args={"options": "-c default_transaction_read_only=on"})
    client = app_on(own_settings, slurm, read_only)
    # Reading still works: a standby serves what it has.
    assert client.get("/jobs", headers=token).status_code == 200
    assert_database_unavailable(client.post("/submit", json=HELLO, headers=token))
    assert account_queue(slurm_account) == []  # the row's commit failed first: nothing reached Slurm
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.get_json()["checks"]["database"] == "unavailable: read-only"


def test_a_read_only_refusal_empties_the_pool(own_url: str) -> None:
    """25006 from the server: the connection is dropped and the next one is new (libpq then picks the leader afresh)."""
    engine = db.make_engine(own_url)
    pid = text("SELECT pg_backend_pid()")
    with engine.connect() as connection:
        first = connection.scalar(pid)
    with engine.connect() as connection:
        assert connection.scalar(pid) == first  # pooled: the same server process
        connection.execute(text("SET TRANSACTION READ ONLY"))
        with pytest.raises(DBAPIError) as refused:
            connection.execute(text("CREATE TABLE never_made (i int)"))
    assert refused.value.orig is not None and refused.value.orig.pgcode == "25006"  # type: ignore[attr-defined]
    assert refused.value.connection_invalidated
    with engine.connect() as connection:
        assert connection.scalar(pid) != first
    engine.dispose()


@pytest.fixture
def record_refused(own_url: str) -> Iterator[Engine]:
    """The database turns read-only after a submit's row commits, before Slurm's id is recorded.

    A trigger raises PostgreSQL's own read_only_sql_transaction (25006) on the update that
    records the id, as a leader demoted between the two statements would.
    """
    engine = db.make_engine(own_url)
    with engine.begin() as connection:
        connection.execute(text(
            "CREATE FUNCTION refuse_record() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'cannot execute UPDATE in a read-only transaction' USING ERRCODE = 'read_only_sql_transaction'; "
            "END $$"
        ))
        connection.execute(text(
            "CREATE TRIGGER refuse_record BEFORE UPDATE ON jobs FOR EACH ROW "
            "WHEN (OLD.slurm_job_id IS NULL AND NEW.slurm_job_id IS NOT NULL) EXECUTE FUNCTION refuse_record()"
        ))
    try:
        yield engine
    finally:
        with engine.begin() as connection:
            connection.execute(text("DROP TRIGGER IF EXISTS refuse_record ON jobs"))
            connection.execute(text("DROP FUNCTION IF EXISTS refuse_record()"))
        engine.dispose()


def test_a_submit_whose_record_fails_after_sbatch_is_answered_201_and_adopted_by_its_tag(
    own_settings: Settings, own_url: str, slurm: SlurmClient, slurm_account: str, token: dict[str, str], record_refused: Engine
) -> None:
    engine = db.make_engine(own_url)
    client = app_on(own_settings.replace(webhook_allow_cidrs=("127.0.0.0/8",)), slurm, engine)
    reply = client.post("/submit", json={**HELLO, "callback_url": "http://127.0.0.1:9/hook"}, headers=token)
    assert reply.status_code == 201, reply.get_data(as_text=True)
    job_id = reply.get_json()["job_id"]
    slurm_job_id = reply.get_json()["slurm_job_id"]
    # The callback's secret comes from the submit's own insert, not a read after sbatch.
    with record_refused.connect() as connection:
        stored = connection.execute(text("SELECT secret FROM webhook_endpoints WHERE job_id = :id"), {"id": job_id}).scalar_one()
    assert reply.get_json()["callback_secret"] == stored
    # Exactly one job in Slurm, carrying the row's tag; the row is there, its id not recorded yet.
    assert account_queue(slurm_account) == [f"{slurm_job_id}|{job_tag(job_id)}"]
    sessions: sessionmaker = db.make_session_factory(record_refused)
    with sessions() as session:
        row = session.scalars(select(Job).where(Job.id == job_id)).one()
        assert (row.slurm_job_id, row.state) == (None, SUBMITTING)
    # The database takes writes again: the refresher adopts Slurm's job by the tag.
    with record_refused.begin() as connection:
        connection.execute(text("DROP TRIGGER refuse_record ON jobs"))
    JobStateRefresher(sessions, slurm, interval_s=1.0, submission_grace_s=60, unknown_after_s=600).refresh()
    with sessions() as session:
        row = session.scalars(select(Job).where(Job.id == job_id)).one()
        assert row.slurm_job_id == slurm_job_id
        assert row.state != SUBMITTING
    engine.dispose()
    cancel_account_jobs(slurm_account)
