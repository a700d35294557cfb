"""the audit log: customers' and operators' changes to access, limits and money

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03

``audit_events``: one row per action that changes who may do what or spend
how much (keys, members, alert settings, webhooks, cancels, web sign-ins; the
operator's accounts, tokens, prices, adjustments and policies), written in the
action's own transaction. Like the ledger, its rows are never changed or
removed: triggers refuse UPDATE, DELETE and TRUNCATE for every role.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

REFUSAL = "audit_events is append-only"
_POSTGRESQL_UPGRADE = (
    f"""
    CREATE FUNCTION gpupool_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{REFUSAL}: % refused', TG_OP USING HINT = 'gpupool never changes or removes audit rows';
    END
    $$
    """,
    """
    CREATE TRIGGER audit_events_no_update_delete BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION gpupool_audit_append_only()
    """,
    """
    CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION gpupool_audit_append_only()
    """,
)
_SQLITE_UPGRADE = tuple(
    f"""
    CREATE TRIGGER audit_events_no_{verb.lower()} BEFORE {verb} ON audit_events
    BEGIN
        SELECT RAISE(ABORT, '{REFUSAL}: {verb} refused');
    END
    """
    for verb in ("UPDATE", "DELETE")
)


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("account", sa.String(64), nullable=True),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("via", sa.String(16), nullable=False),
        sa.Column("credential", sa.String(64), nullable=True),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(255), nullable=True),
        sa.Column("details", sa.JSON(), nullable=True),
    )
    op.create_index("ix_audit_events_account_id", "audit_events", ["account", "id"])
    dialect = op.get_bind().dialect.name
    for statement in _POSTGRESQL_UPGRADE if dialect == "postgresql" else _SQLITE_UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER audit_events_no_truncate ON audit_events")
        op.execute("DROP TRIGGER audit_events_no_update_delete ON audit_events")
        op.execute("DROP FUNCTION gpupool_audit_append_only()")
    op.drop_index("ix_audit_events_account_id", table_name="audit_events")
    op.drop_table("audit_events")
