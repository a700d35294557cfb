"""account_spend: each account's spend per period, kept by the database; adjustments append-only

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05

Every budget check summed an account's whole ledger and adjustments, so a
submit slowed as its account aged. ``account_spend`` holds, per (account,
period), the sum of the ledger's amounts and of the adjustments' amounts, in
nanos. Triggers on INSERT into both tables add each new row's amount in the
inserting transaction, so no writer (the ORM, executemany, COPY, an
operator's psql) can leave them behind.

On PostgreSQL the triggers are statement-level with a transition table: a
pass's COPY of many rows does one upsert per (account, period), in key order
(so two writers take the rows' locks in one order). Their functions are
SECURITY DEFINER, owned by the migrating role that owns ``account_spend``:
the billing role adds ledger rows and adjustments but holds no write
privilege on the totals, and the API only reads them. The search path is
pinned, since the functions run with the owner's rights. On SQLite, row
triggers upsert.

The totals are only exact while their sources never change, so adjustments
become append-only like the ledger (migration 0005): no code path updated or
deleted one, and now no role can, the owner included; a wrong adjustment is
corrected by another. The triggers are made before the backfill: CREATE
TRIGGER holds a lock that keeps inserts out until this transaction commits,
so the backfill sees every row committed before it and every later row
fires a trigger.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

REFUSAL = "adjustments is append-only"
# (source table, the total its amounts add to, the other total)
_SOURCES = (("ledger_entries", "ledger_nanos", "adjustment_nanos"), ("adjustments", "adjustment_nanos", "ledger_nanos"))


def _postgresql_upgrade(schema: str) -> list[str]:
    statements = []
    for table, column, other in _SOURCES:
        function = f"gpupool_spend_add_{table}"
        statements += [
            f"""
            CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql
            SECURITY DEFINER SET search_path = pg_catalog, {schema}, pg_temp AS $$
            BEGIN
                INSERT INTO account_spend AS spend (account, period, {column}, {other})
                SELECT account, period, sum(amount_nanos), 0 FROM new_rows
                GROUP BY account, period ORDER BY account, period
                ON CONFLICT (account, period) DO UPDATE SET {column} = spend.{column} + EXCLUDED.{column};
                RETURN NULL;
            END
            $$
            """,
            # Only its trigger calls it; no role needs to.
            f"REVOKE EXECUTE ON FUNCTION {function}() FROM PUBLIC",
            f"""
            CREATE TRIGGER {table}_spend AFTER INSERT ON {table}
            REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}()
            """,
        ]
    return [
        *statements,
        f"""
        CREATE FUNCTION gpupool_adjustments_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION '{REFUSAL}: % refused; correct an adjustment with another one', TG_OP
                USING HINT = 'spend totals and invoices count every adjustment ever made';
        END
        $$
        """,
        """
        CREATE TRIGGER adjustments_no_update_delete BEFORE UPDATE OR DELETE ON adjustments
        FOR EACH ROW EXECUTE FUNCTION gpupool_adjustments_append_only()
        """,
        """
        CREATE TRIGGER adjustments_no_truncate BEFORE TRUNCATE ON adjustments
        FOR EACH STATEMENT EXECUTE FUNCTION gpupool_adjustments_append_only()
        """,
    ]


_POSTGRESQL_DOWNGRADE = [
    "DROP TRIGGER adjustments_no_truncate ON adjustments",
    "DROP TRIGGER adjustments_no_update_delete ON adjustments",
    "DROP FUNCTION gpupool_adjustments_append_only()",
    *(f"DROP TRIGGER {table}_spend ON {table}" for table, _, _ in _SOURCES),
    *(f"DROP FUNCTION gpupool_spend_add_{table}()" for table, _, _ in _SOURCES),
]
_SQLITE_UPGRADE = [
    *(
        f"""
        CREATE TRIGGER {table}_spend AFTER INSERT ON {table}
        BEGIN
            INSERT INTO account_spend (account, period, {column}, {other})
            VALUES (NEW.account, NEW.period, NEW.amount_nanos, 0)
            ON CONFLICT (account, period) DO UPDATE SET {column} = {column} + excluded.{column};
        END
        """
        for table, column, other in _SOURCES
    ),
    *(
        f"""
        CREATE TRIGGER adjustments_no_{verb.lower()} BEFORE {verb} ON adjustments
        BEGIN
            SELECT RAISE(ABORT, '{REFUSAL}: {verb} refused; correct an adjustment with another one');
        END
        """
        for verb in ("UPDATE", "DELETE")
    ),
]
_SQLITE_DOWNGRADE = [
    "DROP TRIGGER adjustments_no_delete",
    "DROP TRIGGER adjustments_no_update",
    *(f"DROP TRIGGER {table}_spend" for table, _, _ in _SOURCES),
]
_BACKFILL = """
    INSERT INTO account_spend (account, period, ledger_nanos, adjustment_nanos)
    SELECT account, period, sum(ledger), sum(adjustment) FROM (
        SELECT account, period, amount_nanos AS ledger, 0 AS adjustment FROM ledger_entries
        UNION ALL
        SELECT account, period, 0, amount_nanos FROM adjustments
    ) AS spend
    GROUP BY account, period
"""


def upgrade() -> None:
    bind = op.get_bind()
    op.create_table(
        "account_spend",
        sa.Column("account", sa.String(64), primary_key=True),
        sa.Column("period", sa.String(7), primary_key=True),
        sa.Column("ledger_nanos", sa.BigInteger, nullable=False),
        sa.Column("adjustment_nanos", sa.BigInteger, nullable=False),
    )
    if bind.dialect.name == "postgresql":
        schema = bind.dialect.identifier_preparer.quote(bind.execute(sa.text("SELECT current_schema()")).scalar_one())
        statements = _postgresql_upgrade(schema)
    elif bind.dialect.name == "sqlite":
        statements = _SQLITE_UPGRADE
    else:
        raise NotImplementedError(f"gpupool runs on PostgreSQL or SQLite, not {bind.dialect.name}")
    for statement in statements:
        op.execute(statement)
    op.execute(_BACKFILL)


def downgrade() -> None:
    for statement in _POSTGRESQL_DOWNGRADE if op.get_bind().dialect.name == "postgresql" else _SQLITE_DOWNGRADE:
        op.execute(statement)
    op.drop_table("account_spend")
