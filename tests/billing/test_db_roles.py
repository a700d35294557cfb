"""The ledger is append-only by the database: roles and grants on PostgreSQL, triggers on both backends.

Each PostgreSQL test module gets five throwaway login roles (owner, API,
billing, webhook sender, email sender) and a database owned by the first,
migrated and granted by the operator's own ``gpupool db upgrade``; all are
dropped afterwards. The new roles log in without a password, as the test
PostgreSQL trusts 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
from gpupool_client import verify_signature
from sqlalchemy import create_engine, delete, insert, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from api import create_app
from bench.support.http import free_port
from bench.support.services import PG_ADMIN_URL, add_account_row, drop_database, throwaway_slurm_account
from billing import passes
from billing.alerts import set_alert_settings
from billing.report.idle import idle_rows
from gpupool import db
from gpupool.clock import FrozenClock
from gpupool.db.locks import IDLE_CHECK, alone
from gpupool.db.roles import TABLE_ACCESS
from gpupool.gpu_usage.idle_time import store_idle_hours
from gpupool.models import (
    Account,
    AccountSpend,
    Adjustment,
    AlertSent,
    Base,
    BillingPass,
    EmailOutbox,
    IdleGpuHour,
    Job,
    LedgerEntry,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from gpupool.models.alerts import EMAIL_SENT
from gpupool.slurm.client import SlurmClient
from tests.billing.conftest import (
    RTX4090_NANOS,
    LedgerDb,
    member_spend_sums,
    member_spend_totals,
    spend_sums,
    spend_totals,
)
from tests.billing.test_ledger import dump, replay_ok, row
from tests.conftest import SUITE_NOW, base_settings, bearer, wait_for_state
from tests.support.gpu_exporter import serve_exporter
from tests.support.receiver import serve_smtp, serve_webhooks

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
    webhooks_url: str
    email_url: str
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
    roles = {kind: f"gpupool_{kind}_{suffix}" for kind in ("migrate", "api", "billing", "webhooks", "email")}
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
            "db", "upgrade", GPUPOOL_DATABASE_API_ROLE=roles["api"], GPUPOOL_DATABASE_BILLING_ROLE=roles["billing"],
            GPUPOOL_DATABASE_WEBHOOKS_ROLE=roles["webhooks"], GPUPOOL_DATABASE_EMAIL_ROLE=roles["email"],
        )
        assert upgraded.returncode == 0, upgraded.stderr
        assert (
            f"granted roles {roles['api']} (API), {roles['billing']} (billing), {roles['webhooks']} (webhook sender)"
            f" and {roles['email']} (email sender) their privileges"
        ) in upgraded.stdout
        # Prices are the operator's: set through the CLI, as the owner.
        for gpu_type in ("rtx4090", "*"):
            priced = owner.cli("price", "set", gpu_type, "0.00012", "--from", "2020-01-01")
            assert priced.returncode == 0, priced.stderr
        yield RolesDb(
            name=name,
            owner=owner,
            api_url=_url_as(roles["api"], name),
            billing_url=_url_as(roles["billing"], name),
            webhooks_url=_url_as(roles["webhooks"], name),
            email_url=_url_as(roles["email"], name),
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


def assert_append_only(url: str, statement: str, verb: str, table: str = "ledger_entries") -> None:
    error = failure(url, statement)
    assert error.pgcode == RAISED, (statement, error.pgerror)
    assert f"{table} is append-only: {verb} refused" in str(error), statement


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


def spend_alert(billed: RolesDb, tmp_path: Path, account: str, job_id_raw: int, hook_url: str) -> None:
    """A pass, as the billing role, that takes a new ``account`` past 100 % of its credit.

    Its transaction enqueues a budget.threshold delivery to ``hook_url`` (signed with
    ``whsec_<account>``) and an email to ``ops@<account>.example``.
    """
    now = dt.datetime.now(dt.UTC)
    billed.owner.add_account(account, prepaid_credit_nanos=10_000_000)  # 0.01: any run passes 100 %
    with billed.owner.sessions() as session, session.begin():
        set_alert_settings(session, account, (100,), f"ops@{account}.example", now)
        session.add(
            WebhookEndpoint(
                id=f"ep-{account}", account=account, url=hook_url, events="budget.threshold", secret=f"whsec_{account}", created_at=now,
            )
        )
    path = dump(tmp_path, f"{account}.psv", row(job_id_raw, account, "COMPLETED", "2026-11-05T00:00:00", "2026-11-05T00:10:00", 600, TRES))
    as_billing = billed.as_billing()
    try:
        passes.replay(as_billing.sessions, as_billing.settings.replace(smtp_host="127.0.0.1"), path)
    finally:
        as_billing.engine.dispose()


def test_a_pass_as_the_billing_role_records_and_enqueues_a_spend_alert(billed: RolesDb, tmp_path: Path) -> None:
    """The pass's own transaction writes alerts_sent, the webhook event and delivery, and the email."""
    spend_alert(billed, tmp_path, "zulu", 31, "https://hooks.example.com/z")
    with billed.owner.sessions() as session:
        assert session.scalars(select(AlertSent.threshold).where(AlertSent.account == "zulu")).all() == [100]
        assert session.scalars(select(EmailOutbox.recipient).where(EmailOutbox.account == "zulu")).all() == ["ops@zulu.example"]
        assert len(session.scalars(select(WebhookDelivery.id).where(WebhookDelivery.endpoint_id == "ep-zulu")).all()) == 1
    assert_permission_denied(billed.billing_url, "UPDATE alerts_sent SET threshold = 1", "alerts_sent")
    assert_permission_denied(billed.api_url, "SELECT * FROM email_outbox", "email_outbox")


# What each sender's role holds, read back from PostgreSQL's catalog: its own queue, nothing else.
SENDER_GRANTS = {
    "webhooks": {
        ("alembic_version", "SELECT"), ("webhook_endpoints", "SELECT"), ("webhook_events", "SELECT"),
        ("webhook_deliveries", "SELECT"), ("webhook_deliveries", "UPDATE"), ("webhook_attempts", "SELECT"),
        ("webhook_attempts", "INSERT"),
    },
    "email": {("alembic_version", "SELECT"), ("email_outbox", "SELECT"), ("email_outbox", "UPDATE")},
}


def table_grants(roles_db: RolesDb) -> dict[str, set[tuple[str, str]]]:
    """Kind of role -> (table, privilege) it was granted, as the owner (the grantor) sees them."""
    with roles_db.owner.engine.connect() as connection:
        found = connection.execute(
            text("SELECT grantee, table_name, privilege_type FROM information_schema.role_table_grants WHERE grantee = ANY(:roles)"),
            {"roles": list(roles_db.roles.values())},
        ).all()
    kind_of = {role: kind for kind, role in roles_db.roles.items()}
    grants: dict[str, set[tuple[str, str]]] = {kind: set() for kind in roles_db.roles}
    for grantee, table, privilege in found:
        grants[kind_of[grantee]].add((table, privilege))
    return grants


def test_each_sender_role_holds_its_own_queue_and_no_other_role_gained_anything(roles_db: RolesDb) -> None:
    grants = table_grants(roles_db)
    assert {kind: grants[kind] for kind in SENDER_GRANTS} == SENDER_GRANTS
    # Nothing more for the API and billing on the outbox: they add mail, neither marks it sent.
    assert {privilege for table, privilege in grants["api"] if table == "email_outbox"} == {"INSERT"}
    assert {privilege for table, privilege in grants["billing"] if table == "email_outbox"} == {"SELECT", "INSERT"}
    # PostgreSQL's own answers to what a compromised sender would try.
    for statement, table in (
        ("SELECT id FROM jobs", "jobs"),
        ("SELECT id FROM api_keys", "api_keys"),
        ("SELECT recipient FROM email_outbox", "email_outbox"),
        ("UPDATE webhook_endpoints SET url = 'https://elsewhere.example'", "webhook_endpoints"),
        ("DELETE FROM webhook_deliveries", "webhook_deliveries"),
        ("INSERT INTO webhook_events (id, account, type, payload, created_at) VALUES ('evt_x', 'acme', 'job.ended', '{}', now())",
         "webhook_events"),
    ):
        assert_permission_denied(roles_db.webhooks_url, statement, table)
    # The API enqueues deliveries and shows them with their attempts; only the sender marks them and records attempts.
    assert {privilege for table, privilege in grants["api"] if table == "webhook_deliveries"} == {"SELECT", "INSERT"}
    assert {privilege for table, privilege in grants["api"] if table == "webhook_attempts"} == {"SELECT"}
    for statement, table in (
        ("UPDATE webhook_deliveries SET state = 'delivered'", "webhook_deliveries"),
        ("SELECT id FROM webhook_deliveries FOR UPDATE", "webhook_deliveries"),
        ("INSERT INTO webhook_attempts (delivery_id, attempted_at, duration_ms) VALUES (1, now(), 1)", "webhook_attempts"),
    ):
        assert_permission_denied(roles_db.api_url, statement, table)
    for statement, table in (
        ("SELECT name FROM accounts", "accounts"),
        ("SELECT secret FROM webhook_endpoints", "webhook_endpoints"),
        ("DELETE FROM email_outbox", "email_outbox"),
        ("INSERT INTO email_outbox (account, recipient, subject, body, state, attempts, next_attempt_at, created_at)"
         " VALUES ('acme', 'x@example.com', 's', 'b', 'pending', 0, now(), now())", "email_outbox"),
    ):
        assert_permission_denied(roles_db.email_url, statement, table)


def test_without_a_webhooks_role_the_api_role_holds_the_senders_privileges_until_one_is_named(roles_db: RolesDb) -> None:
    """A site without a webhooks role runs `gpupool webhooks run` with the API's role: that role then needs the sender's grants."""
    sender_only = {("webhook_deliveries", "UPDATE"), ("webhook_attempts", "INSERT")}
    named = {
        "GPUPOOL_DATABASE_API_ROLE": roles_db.roles["api"], "GPUPOOL_DATABASE_BILLING_ROLE": roles_db.roles["billing"],
        "GPUPOOL_DATABASE_EMAIL_ROLE": roles_db.roles["email"],
    }
    try:
        upgraded = roles_db.owner.cli("db", "upgrade", **named)
        assert upgraded.returncode == 0, upgraded.stderr
        assert sender_only <= table_grants(roles_db)["api"]
    finally:
        upgraded = roles_db.owner.cli("db", "upgrade", **named, GPUPOOL_DATABASE_WEBHOOKS_ROLE=roles_db.roles["webhooks"])
        assert upgraded.returncode == 0, upgraded.stderr
    grants = table_grants(roles_db)
    assert not sender_only & grants["api"]
    assert {kind: grants[kind] for kind in SENDER_GRANTS} == SENDER_GRANTS


def test_the_email_sender_sends_the_outbox_as_the_email_role(billed: RolesDb, tmp_path: Path) -> None:
    """`gpupool email send-due` as the playbook's gpupool-email.service runs it: the email role, the password from a file."""
    spend_alert(billed, tmp_path, "yankee", 32, "https://hooks.example.com/y")
    password = tmp_path / "smtp_password"
    password.write_text("smtp-secret\n")
    port = free_port()
    smtp = {
        "GPUPOOL_SMTP_HOST": "127.0.0.1", "GPUPOOL_SMTP_PORT": str(port), "GPUPOOL_SMTP_STARTTLS": "false",
        "GPUPOOL_SMTP_USERNAME": "gpupool", "GPUPOOL_SMTP_PASSWORD_FILE": str(password), "GPUPOOL_SMTP_FROM": "billing@gpupool.test",
    }
    # Billing's role queued it and the API's may queue more; neither may mark mail sent.
    for url in (billed.billing_url, billed.api_url):
        refused = billed.owner.cli("email", "send-due", GPUPOOL_DATABASE_URL=url, **smtp)
        assert refused.returncode != 0 and "permission denied for table email_outbox" in refused.stderr, refused.stderr
    with serve_smtp("127.0.0.1", port) as inbox:
        sent = billed.owner.cli("email", "send-due", GPUPOOL_DATABASE_URL=billed.email_url, **smtp)
    assert sent.returncode == 0, sent.stderr
    assert re.fullmatch(r"[1-9]\d* emails sent, 0 failed \(retried later\)\n", sent.stdout), sent.stdout
    [message] = inbox.to("ops@yankee.example")
    assert "Subject: gpupool: account yankee has used 100% of its prepaid credit" in message.content.decode()
    assert set(inbox.logins) == {(b"gpupool", b"smtp-secret")}
    with billed.owner.sessions() as session:
        assert session.scalars(select(EmailOutbox.state).where(EmailOutbox.account == "yankee")).all() == [EMAIL_SENT]


def test_the_webhook_sender_delivers_as_the_webhooks_role(billed: RolesDb, tmp_path: Path) -> None:
    """`gpupool webhooks run` as gpupool-webhooks.service runs it: billing's budget.threshold, signed, to the customer."""
    with serve_webhooks() as receiver:
        spend_alert(billed, tmp_path, "xray", 33, receiver.url)
        sent = billed.owner.cli(
            "webhooks", "run", "--once", GPUPOOL_DATABASE_URL=billed.webhooks_url, GPUPOOL_WEBHOOK_ALLOW_CIDRS="127.0.0.1/32",
        )
    assert sent.returncode == 0, sent.stderr
    [delivery] = receiver.deliveries
    event = verify_signature(delivery.body, delivery.headers["Gpupool-Signature"], "whsec_xray")
    assert event["type"] == "budget.threshold" and event["data"]["alert"]["account"] == "xray"
    with billed.owner.sessions() as session:
        [(state, delivery_id)] = session.execute(
            select(WebhookDelivery.state, WebhookDelivery.id).where(WebhookDelivery.endpoint_id == "ep-xray")
        ).all()
        assert state == "delivered"
        assert session.scalars(select(WebhookAttempt.status_code).where(WebhookAttempt.delivery_id == delivery_id)).all() == [200]


def test_neither_service_role_can_switch_the_ledgers_trigger_off(billed: RolesDb) -> None:
    """What a compromised API or billing worker would try first, with the role it holds."""
    for url in (billed.api_url, billed.billing_url):
        for statement, refusal in (
            ("ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_no_update_delete", "must be owner of table ledger_entries"),
            ("ALTER TABLE ledger_entries DISABLE TRIGGER ALL", "must be owner of table ledger_entries"),
            ("DROP TRIGGER ledger_entries_no_update_delete ON ledger_entries", "must be owner of relation ledger_entries"),
            ("ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_spend", "must be owner of table ledger_entries"),
            ("ALTER TABLE adjustments DISABLE TRIGGER adjustments_spend", "must be owner of table adjustments"),
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
    # Adjustments too (migration 0024): the spend totals count every one ever made.
    assert_append_only(url, "UPDATE adjustments SET amount_nanos = 0", "UPDATE", "adjustments")
    assert_append_only(url, "DELETE FROM adjustments", "DELETE", "adjustments")
    assert_append_only(url, "TRUNCATE adjustments", "TRUNCATE", "adjustments")
    assert spend_totals(billed.owner.engine) == spend_sums(billed.owner.engine)


def test_only_the_databases_triggers_write_the_spend_totals(billed: RolesDb) -> None:
    """The billing role's pass and inserts move the totals (its ledger rows and credits, through triggers
    that run as the owner), yet neither service role can write them, nor call those triggers' code."""
    totals = spend_totals(billed.owner.engine)
    assert totals[("acme", "2026-11")] == (2 * 4200 * RTX4090_NANOS, -2 * 3600 * RTX4090_NANOS)
    assert totals == spend_sums(billed.owner.engine)
    # An API job of alice's, whose ledger row moves her member total too (migration 0025).
    member_job = "00000000-0000-4000-8000-00000000a11c"
    with billed.owner.engine.begin() as connection:
        now = db.utcnow()
        connection.execute(
            insert(Job).values(
                id=member_job, account="acme", owner="alice", name="j", template="hello", params={}, gpus=1, cpus=1, mem_gb=1,
                time_limit_min=1, job_dir="/nonexistent", state="COMPLETED", finished=True, request_hash="0" * 64,
                created_at=now, updated_at=now,
            )
        )
    engine = db.make_engine(billed.billing_url)
    try:
        with engine.connect() as connection:
            pass_id = connection.execute(select(BillingPass.id).limit(1)).scalar_one()
            # Goes in although billing may not even read member_spend: the trigger writes it as the owner.
            connection.execute(insert(LedgerEntry).values(**{**ledger_row(pass_id, 12), "gpupool_job_id": member_job}))
            connection.execute(
                insert(Adjustment).values(
                    account="acme", period="2026-11", amount_nanos=-7, reason="r", kind="manual", created_by="t", created_at=db.utcnow()
                )
            )
            moved = connection.execute(
                select(AccountSpend.ledger_nanos, AccountSpend.adjustment_nanos)
                .where(AccountSpend.account == "acme", AccountSpend.period == "2026-11")
            ).one()
            ledger, adjusted = totals[("acme", "2026-11")]
            assert tuple(moved) == (ledger + 60 * RTX4090_NANOS, adjusted - 7)
            connection.rollback()
    finally:
        engine.dispose()
        with billed.owner.engine.begin() as connection:
            connection.execute(delete(Job).where(Job.id == member_job))
    for url in (billed.api_url, billed.billing_url):
        engine = db.make_engine(url)
        try:
            assert spend_totals(engine) == totals
        finally:
            engine.dispose()
        for statement, table in (
            ("INSERT INTO account_spend (account, period, ledger_nanos, adjustment_nanos) VALUES ('acme', '2026-12', -1000000000000, 0)",
             "account_spend"),
            ("UPDATE account_spend SET ledger_nanos = 0", "account_spend"),
            ("DELETE FROM account_spend", "account_spend"),
            ("TRUNCATE account_spend", "account_spend"),
            ("INSERT INTO member_spend (account, subject, period, ledger_nanos) VALUES ('acme', 'alice', '2026-12', -1)", "member_spend"),
            ("UPDATE member_spend SET ledger_nanos = 0", "member_spend"),
            ("DELETE FROM member_spend", "member_spend"),
            ("TRUNCATE member_spend", "member_spend"),
        ):
            assert_permission_denied(url, statement, table)
        for function in ("gpupool_spend_add_ledger_entries", "gpupool_spend_add_adjustments", "gpupool_member_spend_add_ledger_entries"):
            error = failure(url, f"SELECT {function}()")
            assert error.pgcode == PERMISSION_DENIED and f"permission denied for function {function}" in str(error), error.pgerror
    assert spend_totals(billed.owner.engine) == totals
    assert member_spend_totals(billed.owner.engine) == member_spend_sums(billed.owner.engine)


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
def test_the_idle_check_runs_as_the_api_role_and_exits_3_for_a_node_it_cannot_read(
        billed: RolesDb, job_root: Path, runas_socket: str) -> None:
    """`gpupool idle check` as gpupool-idle-check.service runs it; status 3 is what its unit accepts."""
    settings = base_settings(
        database_url=billed.api_url, job_root=str(job_root), runas_socket=runas_socket, webhook_allow_cidrs=("127.0.0.0/8",)
    )
    engine = db.make_engine(billed.api_url)
    slurm = SlurmClient(settings)
    exporter_url = {"GPUPOOL_GPU_EXPORTER_URL": "http://127.0.0.1:{port}/metrics"}
    try:
        with throwaway_slurm_account(slurm, "idle") as account:
            add_account_row(billed.owner.sessions, account)
            headers = bearer(billed.owner.settings, account)
            client = create_app(settings, slurm=slurm, session_factory=db.make_session_factory(engine), clock=FrozenClock(SUITE_NOW)).test_client()
            created = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 1, "params": {"seconds": 600}})
            assert created.status_code == 201, created.get_json()
            job = wait_for_state(client, created.get_json()["job_id"], headers, {"RUNNING"}, timeout_s=180)
            try:
                # Nothing listens at the exporter's port: the node is named, its job not judged.
                unread = billed.owner.cli(
                    "idle", "check", GPUPOOL_DATABASE_URL=billed.api_url, GPUPOOL_GPU_EXPORTER_PORT=str(free_port()), **exporter_url,
                )
                assert unread.returncode == 3, unread.stdout + unread.stderr
                assert "1 job(s) sampled (0 GPU samples" in unread.stdout
                assert f"  {job['node']}: GPU metrics not read: " in unread.stdout
                with serve_exporter(dict.fromkeys(range(4), 50.0)) as exporter:
                    read = billed.owner.cli(
                        "idle", "check", GPUPOOL_DATABASE_URL=billed.api_url, GPUPOOL_GPU_EXPORTER_PORT=str(exporter.port), **exporter_url,
                    )
                assert read.returncode == 0, read.stdout + read.stderr
                assert "1 job(s) sampled (1 GPU samples" in read.stdout and "not read" not in read.stdout
            finally:
                client.delete(f"/jobs/{job['job_id']}", headers=headers)
    finally:
        engine.dispose()


@pytest.mark.cluster
def test_the_api_submits_and_shows_a_job_as_the_api_role(billed: RolesDb, job_root: Path, runas_socket: str) -> None:
    settings = base_settings(
        database_url=billed.api_url, job_root=str(job_root), runas_socket=runas_socket, webhook_allow_cidrs=("127.0.0.0/8",)
    )
    engine = db.make_engine(billed.api_url)
    slurm = SlurmClient(settings)
    try:
        with throwaway_slurm_account(slurm, "roles") as account:
            # Accounts and tokens are the operator's: written as the owner.
            add_account_row(billed.owner.sessions, account)
            # A budget, so each submit takes the account's budget lock as the API role (a row lock
            # on `accounts` needed UPDATE there, which the API must not have: every such submit failed).
            with billed.owner.sessions() as session, session.begin():
                session.execute(update(Account).where(Account.name == account).values(prepaid_credit_nanos=10**12))
            headers = bearer(billed.owner.settings, account)
            app = create_app(settings, slurm=slurm, session_factory=db.make_session_factory(engine), clock=FrozenClock(SUITE_NOW))
            client = app.test_client()
            registered = client.post("/webhooks", headers=headers, json={"url": "http://127.0.0.1:9/hook", "events": ["job.ended"]})
            assert registered.status_code == 201, registered.get_json()
            created = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 1, "params": {"seconds": 1}})
            assert created.status_code == 201, created.get_json()
            job_id = created.get_json()["job_id"]
            shown = client.get(f"/jobs/{job_id}", headers=headers)
            assert shown.status_code == 200 and shown.get_json()["job_id"] == job_id
            # The refresher, as the API role, records the job's end and enqueues its delivery (the sender's
            # privileges are not the API's), and the API shows it, not yet attempted.
            wait_for_state(client, job_id, headers, {"COMPLETED"})
            endpoint_id = registered.get_json()["id"]
            listed = client.get(f"/webhooks/{endpoint_id}/deliveries", headers=headers)
            assert listed.status_code == 200, listed.get_json()
            assert [(d["job_id"], d["state"], d["attempts"]) for d in listed.get_json()["deliveries"]] == [(job_id, "pending", [])]
            # A member with limits of their own: the member's spend is read under the same lock.
            added = client.put("/account/members/bob", headers=headers, json={"role": "member", "gpu_limit": 1, "monthly_limit": "5.00"})
            assert added.status_code == 200, added.get_json()
            bob = bearer(billed.owner.settings, account, sub="bob")
            by_member = client.post("/submit", headers=bob, json={"template": "hello", "gpus": 1, "params": {"seconds": 1}})
            assert by_member.status_code == 201, by_member.get_json()
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


def test_db_upgrade_refuses_two_services_on_one_role(roles_db: RolesDb) -> None:
    refused = roles_db.owner.cli(
        "db", "upgrade", GPUPOOL_DATABASE_API_ROLE=roles_db.roles["api"], GPUPOOL_DATABASE_BILLING_ROLE=roles_db.roles["billing"],
        GPUPOOL_DATABASE_WEBHOOKS_ROLE=roles_db.roles["api"],
    )
    assert refused.returncode == 1
    assert f"the api and webhooks roles are both {roles_db.roles['api']!r}: each service needs a role of its own" in refused.stderr


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

