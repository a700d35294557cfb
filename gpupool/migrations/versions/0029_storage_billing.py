"""storage billing: a storage price, the bytes each billing pass saw, and storage charges

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-04

Each billing pass records the bytes each account's storage holds
(``storage_samples``, from the filesystem's own count, never a walk of the
files) and charges the interval since the account's previous sample at that
sample's bytes (``storage_charges``, one row per interval within a UTC hour,
unique per account and start, so a pass run again adds nothing). A charge is
never changed or removed, as a ledger row is not (migration 0005), and its
amount adds to ``account_spend.ledger_nanos`` by a trigger, as a ledger row's
does (migration 0024): budgets, credit and spend alerts count storage with no
code of their own. ``storage_prices`` holds the operator's price per GiB-month
(a GiB kept 30 days), effective-dated like GPU prices.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

REFUSAL = "storage_charges is append-only"


def _postgresql_upgrade(schema: str) -> list[str]:
    return [
        f"""
        CREATE FUNCTION gpupool_storage_charges_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION '{REFUSAL}: % refused; correct a charge with an adjustment', TG_OP
                USING HINT = 'gpupool never changes or removes billed rows';
        END
        $$
        """,
        """
        CREATE TRIGGER storage_charges_no_update_delete BEFORE UPDATE OR DELETE ON storage_charges
        FOR EACH ROW EXECUTE FUNCTION gpupool_storage_charges_append_only()
        """,
        """
        CREATE TRIGGER storage_charges_no_truncate BEFORE TRUNCATE ON storage_charges
        FOR EACH STATEMENT EXECUTE FUNCTION gpupool_storage_charges_append_only()
        """,
        # As migration 0024's functions: the owner's rights, a pinned search path, one upsert per key in key order.
        f"""
        CREATE FUNCTION gpupool_spend_add_storage_charges() RETURNS trigger LANGUAGE plpgsql
        SECURITY DEFINER SET search_path = pg_catalog, {schema}, pg_temp AS $$
        BEGIN
            INSERT INTO account_spend AS spend (account, period, ledger_nanos, adjustment_nanos)
            SELECT account, period, sum(amount_nanos), 0 FROM new_rows
            GROUP BY account, period ORDER BY account, period
            ON CONFLICT (account, period) DO UPDATE SET ledger_nanos = spend.ledger_nanos + EXCLUDED.ledger_nanos;
            RETURN NULL;
        END
        $$
        """,
        "REVOKE EXECUTE ON FUNCTION gpupool_spend_add_storage_charges() FROM PUBLIC",
        """
        CREATE TRIGGER storage_charges_spend AFTER INSERT ON storage_charges
        REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION gpupool_spend_add_storage_charges()
        """,
    ]


_POSTGRESQL_DOWNGRADE = [
    "DROP TRIGGER storage_charges_spend ON storage_charges",
    "DROP FUNCTION gpupool_spend_add_storage_charges()",
    "DROP TRIGGER storage_charges_no_truncate ON storage_charges",
    "DROP TRIGGER storage_charges_no_update_delete ON storage_charges",
    "DROP FUNCTION gpupool_storage_charges_append_only()",
]
_SQLITE_UPGRADE = [
    *(
        f"""
        CREATE TRIGGER storage_charges_no_{verb.lower()} BEFORE {verb} ON storage_charges
        BEGIN
            SELECT RAISE(ABORT, '{REFUSAL}: {verb} refused; correct a charge with an adjustment');
        END
        """
        for verb in ("UPDATE", "DELETE")
    ),
    """
    CREATE TRIGGER storage_charges_spend AFTER INSERT ON storage_charges
    BEGIN
        INSERT INTO account_spend (account, period, ledger_nanos, adjustment_nanos)
        VALUES (NEW.account, NEW.period, NEW.amount_nanos, 0)
        ON CONFLICT (account, period) DO UPDATE SET ledger_nanos = ledger_nanos + excluded.ledger_nanos;
    END
    """,
]
_SQLITE_DOWNGRADE = [
    "DROP TRIGGER storage_charges_spend",
    "DROP TRIGGER storage_charges_no_delete",
    "DROP TRIGGER storage_charges_no_update",
]


def upgrade() -> None:
    bind = op.get_bind()
    op.create_table(
        "storage_prices",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("effective_from", UTCDateTime, nullable=False, unique=True),
        sa.Column("nanos_per_gib_month", sa.BigInteger, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_table(
        "storage_samples",
        sa.Column("account", sa.String(64), primary_key=True),
        sa.Column("sampled_at", UTCDateTime, primary_key=True),
        sa.Column("stored_bytes", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "storage_charges",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("pass_id", sa.BigInteger, sa.ForeignKey("billing_passes.id"), nullable=False),
        sa.Column("account", sa.String(64), nullable=False),
        sa.Column("period", sa.String(7), nullable=False),
        sa.Column("interval_from", UTCDateTime, nullable=False),
        sa.Column("interval_to", UTCDateTime, nullable=False),
        sa.Column("stored_bytes", sa.BigInteger, nullable=False),
        sa.Column("byte_seconds", sa.BigInteger, nullable=False),
        sa.Column("nanos_per_gib_month", sa.BigInteger, nullable=False),
        sa.Column("amount_nanos", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("account", "interval_from", name="uq_storage_charge_interval"),
    )
    op.create_index("ix_storage_charges_invoice", "storage_charges", ["account", "period", "nanos_per_gib_month"])
    if bind.dialect.name == "postgresql":
        schema = bind.dialect.identifier_preparer.quote(bind.execute(sa.text("SELECT current_schema()")).scalar_one())
        statements = _postgresql_upgrade(schema)
    elif bind.dialect.name == "sqlite":
        statements = _SQLITE_UPGRADE
    else:
        raise NotImplementedError(f"gpupool runs on PostgreSQL or SQLite, not {bind.dialect.name}")
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    for statement in _POSTGRESQL_DOWNGRADE if op.get_bind().dialect.name == "postgresql" else _SQLITE_DOWNGRADE:
        op.execute(statement)
    op.drop_index("ix_storage_charges_invoice", "storage_charges")
    op.drop_table("storage_charges")
    op.drop_table("storage_samples")
    op.drop_table("storage_prices")
