"""The ledger is append-only by the database: roles and grants on PostgreSQL, triggers on both backends.

Each PostgreSQL test module gets three throwaway login roles (owner, API,
billing) and a database owned by the first, migrated and granted by the
operator's own ``gpupool db upgrade``; all are dropped afterwards. The new
roles log in without a password, as the test PostgreSQL trusts 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
from sqlalchemy import create_engine, delete, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from api import create_app
from billing import passes
from billing.alerts import set_alert_settings
from billing.report.idle import idle_rows
from gpupool import db
from gpupool.db.locks import IDLE_CHECK, alone
from gpupool.db.roles import TABLE_ACCESS
from gpupool.gpu_usage.idle_time import store_idle_hours
from gpupool.models import (
    Account,
    Adjustment,
    AlertSent,
    Base,
    BillingPass,
    EmailOutbox,
    IdleGpuHour,
    Job,
    LedgerEntry,
    WebhookDelivery,
    WebhookEndpoint,
)
from gpupool.slurm.client import SlurmClient
from tests.billing.conftest import RTX4090_NANOS, LedgerDb
from tests.billing.test_ledger import dump, replay_ok, row
from tests.conftest import base_settings, bearer
from tests.support.services import PG_ADMIN_URL, add_account_row, drop_database, throwaway_slurm_account

APPEND_ONLY = "ledger_entries is append-only"
PERMISSION_DENIED = "42501"  # PostgreSQL's insufficient_privilege
RAISED = "P0001"  # raise_exception: the trigger's own error
TRES = "cpu=1,gres/gpu:rtx4090=2,gres/gpu=2"


@dataclass
class RolesDb:
    name: str
    owner: LedgerDb
    api_url: str
    billing_url: str
    roles: dict[str, str]

    def as_billing(self) -> LedgerDb:
        """The operator's CLI, with billing's commands connected as the billing role."""
        settings = self.owner.settings.replace(billing_database_url=self.billing_url)
        engine = db.make_engine(self.billing_url)
        return LedgerDb(url=self.owner.url, engine=engine, sessions=db.make_session_factory(engine), settings=settings)


def _admin_execute(*statements: str) -> None:
    admin = create_engine(db.normalize_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        for statement in statements:
            connection.execute(text(statement))
    admin.dispose()


def _url_as(role: str, database: str) -> str:
    return make_url(PG_ADMIN_URL).set(username=role, password=None, database=database).render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def roles_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolesDb]:
    suffix = secrets.token_hex(4)
    roles = {kind: f"gpupool_{kind}_{suffix}" for kind in ("migrate", "api", "billing")}
    name = f"gpupool_roles_{suffix}"
    _admin_execute(
        *(f'CREATE ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE' for role in roles.values()),
        f'CREATE DATABASE "{name}" OWNER "{roles["migrate"]}"',
    )
    try:
        owner_url = _url_as(roles["migrate"], name)
        engine = db.make_engine(owner_url)
        archive = tmp_path_factory.mktemp("archive")
        owner = LedgerDb(
            url=owner_url,
            engine=engine,
            sessions=db.make_session_factory(engine),
            settings=base_settings(database_url=owner_url, billing_archive_dir=str(archive)),
        )
        upgraded = owner.cli(
            "db", "upgrade", GPUPOOL_DATABASE_API_ROLE=roles["api"], GPUPOOL_DATABASE_BILLING_ROLE=roles["billing"]
        )
        assert upgraded.returncode == 0, upgraded.stderr
        assert f"granted roles {roles['api']} (API) and {roles['billing']} (billing)" in upgraded.stdout
        # Prices are the operator's: set through the CLI, as the owner.
        for gpu_type in ("rtx4090", "*"):
            priced = owner.cli("price", "set", gpu_type, "0.00012", "--from", "2020-01-01")
            assert priced.returncode == 0, priced.stderr
        yield RolesDb(
            name=name,
            owner=owner,
            api_url=_url_as(roles["api"], name),
            billing_url=_url_as(roles["billing"], name),
            roles=roles,
        )
        engine.dispose()
    finally:
        drop_database(name)
        _admin_execute(*(f'DROP ROLE IF EXISTS "{role}"' for role in roles.values()))


@pytest.fixture(scope="module")
def billed(roles_db: RolesDb, tmp_path_factory: pytest.TempPathFactory) -> RolesDb:
    """A replayed pass, as the billing role: ledger rows, a failed-node credit, a pass record."""
    roles_db.owner.add_account("acme")
    path = dump(
        tmp_path_factory.mktemp("sacct"),
        "f.psv",
        row(9, "acme", "NODE_FAIL", "2026-11-03T00:00:00", "2026-11-03T01:00:00", 3600, TRES),
        row(10, "acme", "COMPLETED", "2026-11-03T00:00:00", "2026-11-03T00:10:00", 600, TRES),
    )
    out = replay_ok(roles_db.as_billing(), path)
    assert "2 GPU runs, 2 ledger rows" in out and "1 credits" in out
    return roles_db


def failure(url: str, statement: str) -> psycopg2.Error:
    """PostgreSQL's own error for ``statement``, run as the URL's role; nothing is committed."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            with pytest.raises(DBAPIError) as caught:
                connection.execute(text(statement))
    finally:
        engine.dispose()
    assert isinstance(caught.value.orig, psycopg2.Error)
    return caught.value.orig


def assert_permission_denied(url: str, statement: str, table: str) -> None:
    error = failure(url, statement)
    assert error.pgcode == PERMISSION_DENIED, (statement, error.pgerror)
    assert f"permission denied for table {table}" in str(error), statement


def assert_append_only(url: str, statement: str, verb: str) -> None:
    error = failure(url, statement)
    assert error.pgcode == RAISED, (statement, error.pgerror)
    assert f"{APPEND_ONLY}: {verb} refused" in str(error), statement


def ledger_row(pass_id: int, job_id_raw: int) -> dict[str, object]:
    start = dt.datetime(2026, 11, 4, tzinfo=dt.UTC)
    return {
        "pass_id": pass_id, "account": "acme", "cluster": "gpupool", "slurm_job_id": str(job_id_raw),
        "job_id_raw": job_id_raw, "run_start": start, "gpupool_job_id": None, "job_name": "job",
        "state": "COMPLETED", "gpu_type": "rtx4090", "gpus": 1, "period": "2026-11", "interval_from": start,
        "interval_to": start + dt.timedelta(seconds=60), "seconds": 60, "gpu_seconds": 60,
        "unit_price_nanos": RTX4090_NANOS, "amount_nanos": 60 * RTX4090_NANOS, "correction": False, "final": True,
    }


def test_every_table_of_the_models_has_declared_access() -> None:
    assert set(Base.metadata.tables) <= set(TABLE_ACCESS)


def test_the_api_role_cannot_write_the_ledger_prices_or_adjustments(billed: RolesDb) -> None:
    url = billed.api_url
    assert_permission_denied(url, "UPDATE ledger_entries SET amount_nanos = 0", "ledger_entries")
    assert_permission_denied(url, "DELETE FROM ledger_entries", "ledger_entries")
    assert_permission_denied(url, "TRUNCATE ledger_entries", "ledger_entries")
    assert_permission_denied(
        url,
        "INSERT INTO ledger_entries (pass_id, account, cluster, slurm_job_id, job_id_raw, run_start, job_name, state,"
        " gpu_type, gpus, period, interval_from, interval_to, seconds, gpu_seconds, unit_price_nanos, amount_nanos,"
        " correction, final) SELECT pass_id, account, cluster, slurm_job_id, job_id_raw + 1, run_start, job_name,"
        " state, gpu_type, gpus, period, interval_from, interval_to, seconds, gpu_seconds, unit_price_nanos,"
        " -amount_nanos, correction, final FROM ledger_entries",
        "ledger_entries",
    )
    assert_permission_denied(
        url, "INSERT INTO prices (gpu_type, unit_price_nanos, effective_from, created_at) VALUES ('h100', 0, now(), now())",
        "prices",
    )
    assert_permission_denied(url, "UPDATE prices SET unit_price_nanos = 0", "prices")
    assert_permission_denied(
        url,
        "INSERT INTO adjustments (account, period, amount_nanos, reason, kind, created_by, created_at)"
        " VALUES ('acme', '2026-11', -1000000000000, 'free money', 'manual', 'api', now())",
        "adjustments",
    )
    assert_permission_denied(url, "DELETE FROM adjustments", "adjustments")
    assert_permission_denied(url, "UPDATE billing_state SET mark = NULL", "billing_state")
    assert_permission_denied(url, "INSERT INTO billing_passes (kind) VALUES ('run')", "billing_passes")
    assert_permission_denied(url, "UPDATE accounts SET prepaid_credit_nanos = NULL", "accounts")


def test_the_api_role_reads_what_it_serves_and_writes_jobs(billed: RolesDb) -> None:
    engine = db.make_engine(billed.api_url)
    try:
        db.ensure_migrated(engine)
        sessions = db.make_session_factory(engine)
        with sessions() as session:
            assert session.scalar(select(LedgerEntry.amount_nanos).where(LedgerEntry.job_id_raw == 10)) == 2 * 600 * RTX4090_NANOS
            assert session.scalar(select(Adjustment.kind)) == "failed_node_credit"
        now = db.utcnow()
        with sessions() as session, session.begin():
            session.add(
                Job(
                    id="00000000-0000-4000-8000-000000000001", account="acme", owner="alice", name="j", template="hello",
                    params={}, gpus=1, cpus=1, mem_gb=1, time_limit_min=1, job_dir="/nonexistent", state="PENDING",
                    finished=False, request_hash="0" * 64, created_at=now, updated_at=now,
                )
            )
        with sessions() as session, session.begin():
            job = session.get(Job, "00000000-0000-4000-8000-000000000001")
            assert job is not None
            job.state = "CANCELLED"
            session.delete(job)
    finally:
        engine.dispose()


def test_the_api_role_counts_idle_gpu_hours_for_the_report_and_billing_cannot_see_them(billed: RolesDb) -> None:
    """`gpupool idle check` upserts (INSERT ... ON CONFLICT DO UPDATE, reading the stored count) and
    /admin/report sums them, both as the API's role."""
    job_id = "00000000-0000-4000-8000-000000000021"
    hour = dt.datetime(2026, 11, 3, 10, tzinfo=dt.UTC)
    engine = db.make_engine(billed.api_url)
    try:
        sessions = db.make_session_factory(engine)
        now = db.utcnow()
        with sessions() as session, session.begin():
            session.add(
                Job(
                    id=job_id, account="acme", owner="alice", name="j", template="train", params={}, gpus=1, cpus=1,
                    mem_gb=1, time_limit_min=1, job_dir="/nonexistent", state="RUNNING", finished=False,
                    request_hash="0" * 64, created_at=now, updated_at=now,
                )
            )
        for seconds in (120.0, 180.0, 60.0):
            with sessions() as session, session.begin():
                store_idle_hours(session, job_id, {hour: seconds})
        with sessions() as session:
            assert idle_rows(session, hour, hour + dt.timedelta(hours=1)) == [("acme", "train", 180.0)]
        with sessions() as session, session.begin():
            session.execute(delete(Job).where(Job.id == job_id))  # its hours go with it (ON DELETE CASCADE)
        with sessions() as session:
            assert session.scalars(select(IdleGpuHour.hour).where(IdleGpuHour.job_id == job_id)).all() == []
    finally:
        engine.dispose()
    assert_permission_denied(billed.billing_url, "SELECT * FROM idle_gpu_hours", "idle_gpu_hours")


def test_the_api_role_takes_the_idle_checks_lock_and_a_second_holder_finds_it_held(billed: RolesDb) -> None:
    """`gpupool idle check` runs as the API's role: its advisory lock needs no grant, and it is one holder's at a time."""
    first, second = db.make_engine(billed.api_url), db.make_engine(billed.api_url)
    try:
        with db.make_session_factory(first)() as one, db.make_session_factory(second)() as other:
            with alone(one, IDLE_CHECK) as held:
                assert held
                with alone(other, IDLE_CHECK) as also:
                    assert not also
            with alone(other, IDLE_CHECK) as after:
                assert after  # let go at the end of the block, though its connection stays in the pool
    finally:
        first.dispose()
        second.dispose()


def test_the_billing_role_adds_ledger_rows_but_changes_none(billed: RolesDb) -> None:
    engine = db.make_engine(billed.billing_url)
    try:
        with engine.connect() as connection:
            pass_id = connection.execute(select(BillingPass.id).limit(1)).scalar_one()
            connection.execute(insert(LedgerEntry).values(**ledger_row(pass_id, 11)))
            assert connection.execute(select(LedgerEntry.id).where(LedgerEntry.job_id_raw == 11)).first()
            connection.rollback()
    finally:
        engine.dispose()
    url = billed.billing_url
    assert_permission_denied(url, "UPDATE ledger_entries SET amount_nanos = 0", "ledger_entries")
    assert_permission_denied(url, "DELETE FROM ledger_entries", "ledger_entries")
    assert_permission_denied(url, "TRUNCATE ledger_entries", "ledger_entries")
    assert_permission_denied(
        url, "INSERT INTO prices (gpu_type, unit_price_nanos, effective_from, created_at) VALUES ('h100', 0, now(), now())",
        "prices",
    )
    assert_permission_denied(url, "UPDATE adjustments SET amount_nanos = 0", "adjustments")
    assert_permission_denied(url, "DELETE FROM adjustments", "adjustments")
    assert_permission_denied(url, "UPDATE jobs SET state = 'COMPLETED'", "jobs")


def test_a_pass_as_the_billing_role_records_and_enqueues_a_spend_alert(billed: RolesDb, tmp_path: Path) -> None:
    """The pass's own transaction writes alerts_sent, the webhook event and delivery, and the email."""
    now = dt.datetime.now(dt.UTC)
    billed.owner.add_account("zulu", prepaid_credit_nanos=10_000_000)  # 0.01: any run passes 100 %
    with billed.owner.sessions() as session, session.begin():
        set_alert_settings(session, "zulu", (100,), "ops@zulu.example", now)
        session.add(WebhookEndpoint(id="ep-zulu", account="zulu", url="https://hooks.example.com/z", events="budget.threshold", secret="s", created_at=now))
    path = dump(tmp_path, "z.psv", row(31, "zulu", "COMPLETED", "2026-11-05T00:00:00", "2026-11-05T00:10:00", 600, TRES))
    as_billing = billed.as_billing()
    try:
        passes.replay(as_billing.sessions, as_billing.settings.replace(smtp_host="127.0.0.1"), path)
    finally:
        as_billing.engine.dispose()
    with billed.owner.sessions() as session:
        assert session.scalars(select(AlertSent.threshold).where(AlertSent.account == "zulu")).all() == [100]
        assert session.scalars(select(EmailOutbox.recipient).where(EmailOutbox.account == "zulu")).all() == ["ops@zulu.example"]
        assert len(session.scalars(select(WebhookDelivery.id).where(WebhookDelivery.endpoint_id == "ep-zulu")).all()) == 1
    assert_permission_denied(billed.billing_url, "UPDATE alerts_sent SET threshold = 1", "alerts_sent")
    assert_permission_denied(billed.api_url, "SELECT * FROM email_outbox", "email_outbox")


def test_neither_service_role_can_switch_the_ledgers_trigger_off(billed: RolesDb) -> None:
    """What a compromised API or billing worker would try first, with the role it holds."""
    for url in (billed.api_url, billed.billing_url):
        for statement, refusal in (
            ("ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_no_update_delete", "must be owner of table ledger_entries"),
            ("ALTER TABLE ledger_entries DISABLE TRIGGER ALL", "must be owner of table ledger_entries"),
            ("DROP TRIGGER ledger_entries_no_update_delete ON ledger_entries", "must be owner of relation ledger_entries"),
            # Replacing the trigger's function, or shadowing it with one of its own.
            (
                "CREATE OR REPLACE FUNCTION gpupool_ledger_append_only() RETURNS trigger LANGUAGE plpgsql"
                " AS $$ BEGIN RETURN OLD; END $$",
                "permission denied for schema public",
            ),
        ):
            error = failure(url, statement)
            assert error.pgcode == PERMISSION_DENIED, (statement, error.pgerror)
            assert refusal in str(error), (statement, error.pgerror)
        # Triggers off for the session: superusers only.
        error = failure(url, "SET session_replication_role = replica")
        assert error.pgcode == PERMISSION_DENIED and 'permission denied to set parameter "session_replication_role"' in str(error)
    assert len(billed.owner.ledger("acme")) == 2


def test_not_even_the_owner_can_rewrite_the_ledger(billed: RolesDb) -> None:
    url = billed.owner.url
    assert_append_only(url, "UPDATE ledger_entries SET amount_nanos = 0", "UPDATE")
    assert_append_only(url, "DELETE FROM ledger_entries WHERE job_id_raw = 10", "DELETE")
    assert_append_only(url, "TRUNCATE ledger_entries CASCADE", "TRUNCATE")
    assert len(billed.owner.ledger("acme")) == 2


def test_a_real_pass_runs_as_the_billing_role(billed: RolesDb) -> None:
    """`gpupool billing run` over the cluster's own sacct: its database_url (the API's role) could not bill."""
    result = billed.owner.cli(
        "billing", "run", GPUPOOL_DATABASE_URL=billed.api_url, GPUPOOL_BILLING_DATABASE_URL=billed.billing_url
    )
    assert result.returncode == 0, result.stderr
    assert billed.owner.mark() is not None
    refused = billed.owner.cli("billing", "run", GPUPOOL_DATABASE_URL=billed.api_url)
    assert refused.returncode != 0
    assert "permission denied for table billing_state" in refused.stderr


@pytest.mark.cluster
def test_the_api_submits_and_shows_a_job_as_the_api_role(billed: RolesDb, job_root: Path, runas_socket: str) -> None:
    settings = base_settings(database_url=billed.api_url, job_root=str(job_root), runas_socket=runas_socket)
    engine = db.make_engine(billed.api_url)
    slurm = SlurmClient(settings)
    try:
        with throwaway_slurm_account(slurm, "roles") as account:
            # Accounts and tokens are the operator's: written as the owner.
            add_account_row(billed.owner.sessions, account)
            headers = bearer(billed.owner.settings, account)
            app = create_app(settings, slurm=slurm, session_factory=db.make_session_factory(engine))
            client = app.test_client()
            created = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 1, "params": {"seconds": 1}})
            assert created.status_code == 201, created.get_json()
            job_id = created.get_json()["job_id"]
            shown = client.get(f"/jobs/{job_id}", headers=headers)
            assert shown.status_code == 200 and shown.get_json()["job_id"] == job_id
    finally:
        engine.dispose()


def test_db_upgrade_refuses_a_table_nobody_declared(roles_db: RolesDb) -> None:
    with roles_db.owner.engine.begin() as connection:
        connection.execute(text("CREATE TABLE scratch_notes (id integer PRIMARY KEY)"))
    try:
        refused = roles_db.owner.cli(
            "db", "upgrade",
            GPUPOOL_DATABASE_API_ROLE=roles_db.roles["api"], GPUPOOL_DATABASE_BILLING_ROLE=roles_db.roles["billing"],
        )
        assert refused.returncode == 1
        assert "scratch_notes have no line in gpupool.db.roles.TABLE_ACCESS" in refused.stderr
    finally:
        with roles_db.owner.engine.begin() as connection:
            connection.execute(text("DROP TABLE scratch_notes"))


def test_db_upgrade_refuses_roles_no_grant_can_limit(roles_db: RolesDb) -> None:
    for api_role, reason in (
        (roles_db.roles["migrate"], "is the role running the migrations"),
        ("postgres", "is a superuser"),
    ):
        refused = roles_db.owner.cli(
            "db", "upgrade", GPUPOOL_DATABASE_API_ROLE=api_role, GPUPOOL_DATABASE_BILLING_ROLE=roles_db.roles["billing"]
        )
        assert refused.returncode == 1
        assert reason in refused.stderr


def test_sqlite_refuses_to_update_or_delete_ledger_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    engine = db.make_engine(url)
    try:
        db.upgrade(engine)
        with engine.begin() as connection:
            connection.execute(insert(Account).values(name="acme", created_at=db.utcnow()))
            now = db.utcnow()
            pass_id = connection.execute(
                insert(BillingPass).values(
                    kind="replay", started_at=now, finished_at=now, source="test", source_sha256="", sacct_rows=0,
                    ledger_rows=1, adjustment_rows=0,
                )
            ).inserted_primary_key[0]
            connection.execute(insert(LedgerEntry).values(**ledger_row(pass_id, 12)))
        for statement, verb in (
            ("UPDATE ledger_entries SET amount_nanos = 0", "UPDATE"),
            ("DELETE FROM ledger_entries", "DELETE"),
        ):
            with engine.begin() as connection, pytest.raises(DBAPIError) as caught:
                connection.execute(text(statement))
            assert f"{APPEND_ONLY}: {verb} refused" in str(caught.value.orig)
        with engine.connect() as connection:
            assert connection.execute(select(LedgerEntry.amount_nanos)).scalar_one() == 60 * RTX4090_NANOS
    finally:
        engine.dispose()

