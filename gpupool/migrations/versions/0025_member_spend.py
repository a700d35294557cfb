"""member_spend: what each member's jobs were billed per period, kept by the database

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04

A member's monthly limit summed the month's ledger rows of the jobs that
member submitted, under the account's budget lock, on every submit: 21 ms for
an account with 10,000 jobs a month (20,000 ledger rows), as much as the rest
of a submit. ``member_spend`` holds, per (account, subject, period), the
ledger amounts of the rows whose ``gpupool_job_id`` names a job that subject
submitted in that account. Adjustments are the account's and never count
here. As ``account_spend`` (migration 0024), a trigger on INSERT into
``ledger_entries`` adds each new row in the inserting transaction, whoever
inserts it and however; on PostgreSQL a statement trigger over the transition
table, in key order, whose SECURITY DEFINER function (owned by the migrating
role, search path pinned, EXECUTE revoked) lets the billing role fire it
without holding any write privilege on the totals. A job's owner and account
never change, and a job row is only deleted when Slurm never took the job
(so no ledger row names it): the totals stay what the rows sum to. The
trigger is made before the backfill, as 0024's.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_FUNCTION = "gpupool_member_spend_add_ledger_entries"


def _postgresql_upgrade(schema: str) -> list[str]:
    return [
        f"""
        CREATE FUNCTION {_FUNCTION}() RETURNS trigger LANGUAGE plpgsql
        SECURITY DEFINER SET search_path = pg_catalog, {schema}, pg_temp AS $$
        BEGIN
            INSERT INTO member_spend AS spend (account, subject, period, ledger_nanos)
            SELECT new_rows.account, jobs.owner, new_rows.period, sum(new_rows.amount_nanos)
            FROM new_rows JOIN jobs ON jobs.id = new_rows.gpupool_job_id AND jobs.account = new_rows.account
            GROUP BY new_rows.account, jobs.owner, new_rows.period
            ORDER BY new_rows.account, jobs.owner, new_rows.period
            ON CONFLICT (account, subject, period) DO UPDATE SET ledger_nanos = spend.ledger_nanos + EXCLUDED.ledger_nanos;
            RETURN NULL;
        END
        $$
        """,
        # Only its trigger calls it; no role needs to.
        f"REVOKE EXECUTE ON FUNCTION {_FUNCTION}() FROM PUBLIC",
        f"""
        CREATE TRIGGER ledger_entries_member_spend AFTER INSERT ON ledger_entries
        REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {_FUNCTION}()
        """,
    ]


_POSTGRESQL_DOWNGRADE = [
    "DROP TRIGGER ledger_entries_member_spend ON ledger_entries",
    f"DROP FUNCTION {_FUNCTION}()",
]
# SQLite: a row trigger. The SELECT's WHERE keeps the upsert's ON CONFLICT from being read as a join's.
_SQLITE_UPGRADE = [
    """
    CREATE TRIGGER ledger_entries_member_spend AFTER INSERT ON ledger_entries
    BEGIN
        INSERT INTO member_spend (account, subject, period, ledger_nanos)
        SELECT NEW.account, jobs.owner, NEW.period, NEW.amount_nanos FROM jobs
        WHERE jobs.id = NEW.gpupool_job_id AND jobs.account = NEW.account
        ON CONFLICT (account, subject, period) DO UPDATE SET ledger_nanos = ledger_nanos + excluded.ledger_nanos;
    END
    """,
]
_SQLITE_DOWNGRADE = ["DROP TRIGGER ledger_entries_member_spend"]
_BACKFILL = """
    INSERT INTO member_spend (account, subject, period, ledger_nanos)
    SELECT ledger_entries.account, jobs.owner, ledger_entries.period, sum(ledger_entries.amount_nanos)
    FROM ledger_entries JOIN jobs ON jobs.id = ledger_entries.gpupool_job_id AND jobs.account = ledger_entries.account
    GROUP BY ledger_entries.account, jobs.owner, ledger_entries.period
"""


def upgrade() -> None:
    bind = op.get_bind()
    op.create_table(
        "member_spend",
        sa.Column("account", sa.String(64), primary_key=True),
        sa.Column("subject", sa.String(255), primary_key=True),
        sa.Column("period", sa.String(7), primary_key=True),
        sa.Column("ledger_nanos", sa.BigInteger, nullable=False),
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
    op.drop_table("member_spend")
