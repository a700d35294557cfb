"""ledger append-only by the database: triggers and roles

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

Triggers refuse UPDATE, DELETE and (PostgreSQL) TRUNCATE of ledger rows for
every role, the owner included; a charge is corrected by a new correction row
or an adjustment, never by rewriting one. What each service role may do with
each table is not history but state: ``gpupool db upgrade`` grants it after
the migrations, from ``gpupool.db.roles``.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

REFUSAL = "ledger_entries is append-only"
_POSTGRESQL_UPGRADE = (
    f"""
    CREATE FUNCTION gpupool_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{REFUSAL}: % refused; correct a charge with a new row or an adjustment', TG_OP
            USING HINT = 'gpupool never changes or removes billed rows';
    END
    $$
    """,
    """
    CREATE TRIGGER ledger_entries_no_update_delete BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION gpupool_ledger_append_only()
    """,
    # Row triggers never see TRUNCATE; a statement trigger does.
    """
    CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION gpupool_ledger_append_only()
    """,
)
_POSTGRESQL_DOWNGRADE = (
    "DROP TRIGGER ledger_entries_no_truncate ON ledger_entries",
    "DROP TRIGGER ledger_entries_no_update_delete ON ledger_entries",
    "DROP FUNCTION gpupool_ledger_append_only()",
)
# SQLite has no TRUNCATE: a DELETE without WHERE fires the row trigger too.
_SQLITE_UPGRADE = tuple(
    f"""
    CREATE TRIGGER ledger_entries_no_{verb.lower()} BEFORE {verb} ON ledger_entries
    BEGIN
        SELECT RAISE(ABORT, '{REFUSAL}: {verb} refused; correct a charge with a new row or an adjustment');
    END
    """
    for verb in ("UPDATE", "DELETE")
)
_SQLITE_DOWNGRADE = ("DROP TRIGGER ledger_entries_no_delete", "DROP TRIGGER ledger_entries_no_update")


def _statements(postgresql: tuple[str, ...], sqlite: tuple[str, ...]) -> tuple[str, ...]:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql
    if dialect == "sqlite":
        return sqlite
    raise NotImplementedError(f"gpupool runs on PostgreSQL or SQLite, not {dialect}")


def upgrade() -> None:
    for statement in _statements(_POSTGRESQL_UPGRADE, _SQLITE_UPGRADE):
        op.execute(statement)


def downgrade() -> None:
    for statement in _statements(_POSTGRESQL_DOWNGRADE, _SQLITE_DOWNGRADE):
        op.execute(statement)
