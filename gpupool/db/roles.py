"""What each service's PostgreSQL role may do with each table.

One database, one owner. The migrating role owns every table and runs
``gpupool db upgrade`` and the operator's commands; the API, the billing
worker, the webhook sender and the email sender log in as roles of their own
that get exactly the privileges below (the last two are optional: a site
without them runs the webhook sender with the API's role, which then also
gets the sender's privileges, and the email sender with the owner's). The API
can therefore
never write the ledger, prices or adjustments, billing can only add ledger
rows, and the two senders touch nothing but their own queue; the triggers of
migrations 0005 and 0024 refuse UPDATE, DELETE and TRUNCATE of ledger rows and
adjustments even to the owner. No service role may write the spend totals
(``account_spend``, ``member_spend``): the database's own triggers keep them.

``TABLE_ACCESS`` is the one list. ``gpupool db upgrade`` revokes what the
service roles hold on the schema's tables and sequences and grants this list again,
in the migration's transaction, each time it runs: a migration that adds a
table adds its line here, and a table in the database without a line fails
the upgrade rather than being served with privileges nobody chose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import bindparam, inspect, text
from sqlalchemy.engine import Connection

from gpupool.errors import ConfigError

API = "api"
BILLING = "billing"
# `gpupool webhooks run` and `gpupool email send-due`, each with a role of its own.
WEBHOOKS = "webhooks"
EMAIL = "email"
SERVICES = (API, BILLING, WEBHOOKS, EMAIL)

READ = ("SELECT",)
APPEND = ("SELECT", "INSERT")
READ_WRITE = ("SELECT", "INSERT", "UPDATE")
NONE: tuple[str, ...] = ()

# table -> service -> privileges. SELECT comes with every write: UPDATE ... WHERE
# and INSERT ... RETURNING read the rows they touch.
TABLE_ACCESS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    # Each checks the schema revision before it starts.
    "alembic_version": {API: READ, BILLING: READ, WEBHOOKS: READ, EMAIL: READ},
    # Accounts, prices and manual adjustments are the operator's, through the CLI.
    "accounts": {API: READ, BILLING: READ},
    "prices": {API: READ, BILLING: READ},
    # The API drops the row of a job Slurm never took, so its Idempotency-Key frees up.
    "jobs": {API: ("SELECT", "INSERT", "UPDATE", "DELETE"), BILLING: READ},
    "slurm_sync": {API: READ_WRITE, BILLING: NONE},
    "ledger_entries": {API: READ, BILLING: APPEND},
    # Billing adds failed-node credits; spend and invoices read them.
    "adjustments": {API: READ, BILLING: APPEND},
    # Spend per account and period, for budgets: only the triggers of migration 0024 write it
    # (SECURITY DEFINER, as the owner), whichever role inserts the ledger row or adjustment.
    "account_spend": {API: READ, BILLING: READ},
    # Spend per member (the ledger rows of the jobs each submitted), for members' monthly limits:
    # only the trigger of migration 0025 writes it. Billing reads it to push each member's
    # Slurm budget (what is left of their monthly limit) after its pass.
    "member_spend": {API: READ, BILLING: READ},
    # Account storage, billed per GiB-month: the price is the operator's; each billing pass records
    # the bytes it saw and charges the intervals since (append-only, as the ledger; a trigger of
    # migration 0029 adds each charge to account_spend). The API reads them for /usage and invoices.
    "storage_prices": {API: READ, BILLING: READ},
    "storage_samples": {API: READ, BILLING: APPEND},
    "storage_charges": {API: READ, BILLING: APPEND},
    # A pass inserts its record first and fills in the totals before it commits.
    "billing_passes": {API: NONE, BILLING: READ_WRITE},
    # Updating the single row is billing's lock.
    "billing_state": {API: NONE, BILLING: ("SELECT", "UPDATE")},
    # Token ids the API checks revocation against; the CLI issues them.
    "issued_tokens": {API: READ, BILLING: NONE},
    # Customers create, use (last_used_at) and revoke their own keys through the API.
    "api_keys": {API: READ_WRITE, BILLING: NONE},
    # Account admins manage their members through the API; the API reads a caller's role and limits.
    # Billing reads members' limits to push them into Slurm after its pass.
    "account_members": {API: READ_WRITE, BILLING: READ},
    # Members' own Unix and Slurm users: made by `gpupool member migrate` (the owner, as root).
    # The API submits as them; billing accepts their sacct rows for their account alone.
    "member_identities": {API: READ, BILLING: READ},
    # The web pages' sign-ins: made at sign-in, deleted at sign-out (and once expired).
    "web_sessions": {API: ("SELECT", "INSERT", "DELETE"), BILLING: NONE},
    # Customers register endpoints through the API (a forgotten job's callback goes
    # with it); the API's refresher records events and enqueues their deliveries, and
    # billing enqueues budget.threshold events and their deliveries in its pass; the API
    # shows each delivery and its attempts. Only `gpupool webhooks run` reads each due
    # delivery's event and endpoint (its URL and signing secret) to send it, claims and
    # marks the delivery (FOR UPDATE needs UPDATE) and records its attempts: a site without
    # a webhooks role runs it with the API's, which then gets these too (see privileges_of).
    "webhook_endpoints": {API: ("SELECT", "INSERT", "UPDATE", "DELETE"), BILLING: READ, WEBHOOKS: READ},
    "webhook_events": {API: APPEND, BILLING: APPEND, WEBHOOKS: READ},
    "webhook_deliveries": {API: APPEND, BILLING: APPEND, WEBHOOKS: ("SELECT", "UPDATE")},
    "webhook_attempts": {API: READ, BILLING: NONE, WEBHOOKS: APPEND},
    # Spend alerts: billing records each crossed threshold and enqueues its email;
    # the API shows which fired and `gpupool email send-due` sends the outbox.
    # Thresholds are the account's own (PUT /account/alerts), in a table of their own
    # so the API never needs to write `accounts` (budgets are the operator's).
    "alert_settings": {API: READ_WRITE, BILLING: READ},
    "alerts_sent": {API: READ, BILLING: APPEND},
    # `gpupool idle check` (with the API's environment) queues job.idle emails too, without
    # reading the outbox back (an INSERT with no RETURNING): the API never reads anyone's mail.
    # Only the email sender reads the outbox and marks what it sent; it adds nothing.
    "email_outbox": {API: ("INSERT",), BILLING: APPEND, EMAIL: ("SELECT", "UPDATE")},
    # Idle GPUs: `gpupool idle check`, with the API's environment, records and prunes each job's
    # GPU samples (GET /jobs/<id> shows them); the policies are the operator's (`gpupool idle policy set`).
    "gpu_samples": {API: ("SELECT", "INSERT", "DELETE"), BILLING: NONE},
    "idle_policies": {API: READ, BILLING: NONE},
    # The audit log: the API records customers' actions and shows an account's admins their own;
    # the operator's commands record theirs as the owner. Triggers refuse UPDATE and DELETE to all.
    "audit_events": {API: APPEND, BILLING: NONE},
    # The same pass adds each job's idle GPU-seconds per hour (an upsert that keeps the larger
    # count); the operator report (/admin/report, with the API's role) sums them.
    "idle_gpu_hours": {API: READ_WRITE, BILLING: NONE},
    # Hardware costs for the operator report; set with `gpupool node cost set`.
    "node_costs": {API: READ, BILLING: NONE},
    # GPU-check drains: each billing pass records a new one (and emails the operator through
    # email_outbox) and notes when the node came back; the operator report reads them.
    "node_health_events": {API: READ, BILLING: READ_WRITE},
    # Interactive sessions: the API records them at submit, their port and activity, and the idle stop.
    "job_sessions": {API: ("SELECT", "INSERT", "UPDATE", "DELETE"), BILLING: NONE},
    # An array job's tasks: made at submit, kept by the refresher; they go with a job Slurm never took.
    "job_tasks": {API: ("SELECT", "INSERT", "UPDATE", "DELETE"), BILLING: NONE},
    # Single-use links and the cookies they set; expired ones are swept as new ones are made.
    "session_grants": {API: ("SELECT", "INSERT", "UPDATE", "DELETE"), BILLING: NONE},
}


# Columns a service may write in a table it otherwise only reads: (table, columns) -> service -> privileges.
# A billing pass that credits a run a failed GPU ended says so in the job's end_reason
# (billing.gpu_failures); updated_at is the ORM's own stamp of any change to a job row.
COLUMN_ACCESS: Mapping[tuple[str, tuple[str, ...]], Mapping[str, tuple[str, ...]]] = {
    ("jobs", ("end_reason", "updated_at")): {BILLING: ("UPDATE",)},
}


@dataclass(frozen=True)
class ServiceRoles:
    """PostgreSQL role names of the API, the billing worker and, where they have their own, the two senders."""

    api: str
    billing: str
    webhooks: str = ""
    email: str = ""

    def by_service(self) -> dict[str, str]:
        named = {API: self.api, BILLING: self.billing, WEBHOOKS: self.webhooks, EMAIL: self.email}
        return {service: name for service, name in named.items() if name}


def _check_roles(connection: Connection, roles: ServiceRoles) -> None:
    services_of: dict[str, list[str]] = {}
    for service, name in roles.by_service().items():
        services_of.setdefault(name, []).append(service)
    for name, services in services_of.items():
        if len(services) > 1:
            raise ConfigError(f"the {' and '.join(services)} roles are both {name!r}: each service needs a role of its own")
    migrating_role = connection.execute(text("SELECT current_user")).scalar_one()
    # rolname -> whether no grant can limit it: superuser, above row security, or the owner by membership.
    unlimited: dict[str, bool] = dict(
        connection.execute(
            text(
                "SELECT rolname, rolsuper OR rolbypassrls OR pg_has_role(rolname, current_user, 'MEMBER')"
                " FROM pg_roles WHERE rolname IN :names"
            ).bindparams(bindparam("names", expanding=True)),
            {"names": sorted(services_of)},
        ).all()
    )
    for service, name in roles.by_service().items():
        if name == migrating_role:
            raise ConfigError(
                f"the {service} role {name!r} is the role running the migrations, which owns every table; "
                "give the service a role of its own"
            )
        if name not in unlimited:
            raise ConfigError(f"the {service} role {name!r} does not exist; create it first (the playbook does)")
        if unlimited[name]:
            raise ConfigError(
                f"the {service} role {name!r} is a superuser, bypasses row security or is a member of "
                f"{migrating_role!r}, the tables' owner: no grant can limit it"
            )


def _sequences_of(connection: Connection, table: str) -> list[str]:
    """Sequences behind the table's serial or identity columns."""
    return list(
        connection.execute(
            text(
                "SELECT seq.relname FROM pg_class seq"
                " JOIN pg_depend dep ON dep.objid = seq.oid AND dep.deptype IN ('a', 'i')"
                " JOIN pg_class tab ON tab.oid = dep.refobjid"
                " WHERE seq.relkind = 'S' AND tab.relname = :table"
                " AND tab.relnamespace = current_schema()::regnamespace"
            ),
            {"table": table},
        ).scalars()
    )


def privileges_of(table: str, service: str, roles: ServiceRoles) -> tuple[str, ...]:
    """What ``service``'s role is granted on ``table``: its line in ``TABLE_ACCESS``, and the webhook sender's where the API runs it."""
    privileges = TABLE_ACCESS[table].get(service, NONE)
    if service == API and not roles.webhooks:
        # No webhooks role: the sender logs in as the API, so the API's role holds its privileges too.
        sender = TABLE_ACCESS[table].get(WEBHOOKS, NONE)
        privileges = privileges + tuple(privilege for privilege in sender if privilege not in privileges)
    return privileges


def grant_statements(connection: Connection, roles: ServiceRoles) -> list[str]:
    """REVOKE and GRANT statements that give every service role exactly ``TABLE_ACCESS``."""
    tables = set(inspect(connection).get_table_names())
    unlisted = sorted(tables - set(TABLE_ACCESS))
    if unlisted:
        raise ConfigError(
            f"table(s) {', '.join(unlisted)} have no line in gpupool.db.roles.TABLE_ACCESS: "
            "say what each service may do with them before granting anything"
        )
    quote = connection.dialect.identifier_preparer.quote
    grantees = ", ".join(quote(name) for name in roles.by_service().values())
    schema = quote(connection.execute(text("SELECT current_schema()")).scalar_one())
    statements = [
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {grantees}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {grantees}",
        f"GRANT USAGE ON SCHEMA {schema} TO {grantees}",
    ]
    for table in sorted(tables):
        for service, role in roles.by_service().items():
            privileges = privileges_of(table, service, roles)
            if not privileges:
                continue
            statements.append(f"GRANT {', '.join(privileges)} ON {quote(table)} TO {quote(role)}")
            if "INSERT" in privileges:
                statements.extend(
                    f"GRANT USAGE ON SEQUENCE {quote(sequence)} TO {quote(role)}"
                    for sequence in _sequences_of(connection, table)
                )
    for (table, columns), services in sorted(COLUMN_ACCESS.items()):
        if table not in tables:
            continue
        for service, role in roles.by_service().items():
            for privilege in services.get(service, NONE):
                statements.append(
                    f"GRANT {privilege} ({', '.join(quote(column) for column in columns)}) ON {quote(table)} TO {quote(role)}"
                )
    return statements


def apply_grants(connection: Connection, roles: ServiceRoles) -> list[str]:
    """Give the service roles exactly ``TABLE_ACCESS``, inside the caller's transaction."""
    if connection.dialect.name != "postgresql":
        raise ConfigError("database roles are PostgreSQL's; on SQLite every process shares one file")
    _check_roles(connection, roles)
    statements = grant_statements(connection, roles)
    for statement in statements:
        connection.execute(text(statement))
    return statements
