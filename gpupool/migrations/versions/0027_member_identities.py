"""member_identities: each member who runs jobs gets a Unix and Slurm user of their own; jobs record which user ran them

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-05

``member_identities`` holds, per (account, subject), the member's own Unix
user and the uid every host gives it (``gpupool member migrate`` makes them;
the playbook's tenants step reads them from ``gpupool account list --json``).
A row outlives the membership, so jobs of a member who left are still followed
and billed under their user.

``jobs.unix_user`` and ``jobs.unix_uid`` record the user a job was submitted
as. Every job before this migration ran as its account's tenant user, which a
NULL means, so they keep being followed, cancelled and billed as before.

``ledger_entries.member_user`` records the member's own user that ran a billed
job, and ``member_spend``'s trigger (migration 0025's, replaced here) now also
adds a row of no API job to the member whose user ran it: a member's direct
sbatch, from inside a job of theirs, counts in their monthly spend like their
API jobs do, and so in the Slurm budget made from it. Rows written before this
migration name no member user and are counted as they were.

(Written to follow 0025; the lead's 0026 comes between them at merge.)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

_FUNCTION = "gpupool_member_spend_add_ledger_entries"  # migration 0025's, replaced in place


def _postgresql_function(schema: str, *, members: bool) -> str:
    """The trigger function: the rows' API jobs' owners (0025); with ``members``, also the members whose users ran the rest."""
    if members:
        source = """
            SELECT new_rows.account AS account, COALESCE(jobs.owner, identity.subject) AS subject,
                   new_rows.period AS period, new_rows.amount_nanos AS amount_nanos
            FROM new_rows
            LEFT JOIN jobs ON jobs.id = new_rows.gpupool_job_id AND jobs.account = new_rows.account
            LEFT JOIN member_identities AS identity
                ON jobs.id IS NULL AND identity.account = new_rows.account AND identity.unix_user = new_rows.member_user
            WHERE jobs.id IS NOT NULL OR identity.subject IS NOT NULL
        """
    else:
        source = """
            SELECT new_rows.account AS account, jobs.owner AS subject, new_rows.period AS period,
                   new_rows.amount_nanos AS amount_nanos
            FROM new_rows JOIN jobs ON jobs.id = new_rows.gpupool_job_id AND jobs.account = new_rows.account
        """
    # CREATE OR REPLACE keeps the function's owner and its revoked EXECUTE (0025's).
    return f"""
        CREATE OR REPLACE FUNCTION {_FUNCTION}() RETURNS trigger LANGUAGE plpgsql
        SECURITY DEFINER SET search_path = pg_catalog, {schema}, pg_temp AS $$
        BEGIN
            INSERT INTO member_spend AS spend (account, subject, period, ledger_nanos)
            SELECT billed.account, billed.subject, billed.period, sum(billed.amount_nanos)
            FROM ({source}) AS billed
            GROUP BY billed.account, billed.subject, billed.period
            ORDER BY billed.account, billed.subject, billed.period
            ON CONFLICT (account, subject, period) DO UPDATE SET ledger_nanos = spend.ledger_nanos + EXCLUDED.ledger_nanos;
            RETURN NULL;
        END
        $$
    """


# SQLite: a row trigger, as 0025's. At most one of the two SELECTs yields a row: a job's
# id is its key, and a member user names one identity. The WHERE keeps the upsert's ON
# CONFLICT from being read as a join's.
_SQLITE_MEMBERS_TRIGGER = """
    CREATE TRIGGER ledger_entries_member_spend AFTER INSERT ON ledger_entries
    BEGIN
        INSERT INTO member_spend (account, subject, period, ledger_nanos)
        SELECT NEW.account, billed.subject, NEW.period, NEW.amount_nanos FROM (
            SELECT jobs.owner AS subject FROM jobs WHERE jobs.id = NEW.gpupool_job_id AND jobs.account = NEW.account
            UNION ALL
            SELECT identity.subject FROM member_identities AS identity
            WHERE identity.account = NEW.account AND identity.unix_user = NEW.member_user
              AND NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = NEW.gpupool_job_id AND jobs.account = NEW.account)
        ) AS billed WHERE true
        ON CONFLICT (account, subject, period) DO UPDATE SET ledger_nanos = ledger_nanos + excluded.ledger_nanos;
    END
"""
_SQLITE_0025_TRIGGER = """
    CREATE TRIGGER ledger_entries_member_spend AFTER INSERT ON ledger_entries
    BEGIN
        INSERT INTO member_spend (account, subject, period, ledger_nanos)
        SELECT NEW.account, jobs.owner, NEW.period, NEW.amount_nanos FROM jobs
        WHERE jobs.id = NEW.gpupool_job_id AND jobs.account = NEW.account
        ON CONFLICT (account, subject, period) DO UPDATE SET ledger_nanos = ledger_nanos + excluded.ledger_nanos;
    END
"""


def _spend_trigger(*, members: bool) -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        schema = bind.dialect.identifier_preparer.quote(bind.execute(sa.text("SELECT current_schema()")).scalar_one())
        op.execute(_postgresql_function(schema, members=members))
    elif bind.dialect.name == "sqlite":
        op.execute("DROP TRIGGER ledger_entries_member_spend")
        op.execute(_SQLITE_MEMBERS_TRIGGER if members else _SQLITE_0025_TRIGGER)
    else:
        raise NotImplementedError(f"gpupool runs on PostgreSQL or SQLite, not {bind.dialect.name}")


def upgrade() -> None:
    op.create_table(
        "member_identities",
        sa.Column("account", sa.String(64), sa.ForeignKey("accounts.name"), primary_key=True),
        sa.Column("subject", sa.String(255), primary_key=True),
        sa.Column("unix_user", sa.String(32), nullable=False),
        sa.Column("unix_uid", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_index("uq_member_identities_unix_user", "member_identities", ["unix_user"], unique=True)
    op.create_index("uq_member_identities_unix_uid", "member_identities", ["unix_uid"], unique=True)
    # Plain ADD COLUMN, nullable: no table rewrite on either database, whatever the number of jobs.
    op.add_column("jobs", sa.Column("unix_user", sa.String(32), nullable=True))
    op.add_column("jobs", sa.Column("unix_uid", sa.Integer(), nullable=True))
    op.add_column("ledger_entries", sa.Column("member_user", sa.String(32), nullable=True))
    _spend_trigger(members=True)


def downgrade() -> None:
    _spend_trigger(members=False)
    # Plain DROP COLUMN on both databases (SQLite 3.35+): a batch copy of jobs or
    # ledger_entries would break the triggers that name them.
    for table, column in (("ledger_entries", "member_user"), ("jobs", "unix_uid"), ("jobs", "unix_user")):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    op.drop_index("uq_member_identities_unix_uid", table_name="member_identities")
    op.drop_index("uq_member_identities_unix_user", table_name="member_identities")
    op.drop_table("member_identities")
