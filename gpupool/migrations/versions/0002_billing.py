"""billing: ledger, prices, adjustments, passes, budgets

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("accounts", sa.Column("prepaid_credit_nanos", sa.BigInteger, nullable=True))
    op.add_column("accounts", sa.Column("monthly_limit_nanos", sa.BigInteger, nullable=True))
    state = op.create_table(
        "billing_state",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("mark", UTCDateTime, nullable=True),
        sa.Column("locked_at", UTCDateTime, nullable=True),
    )
    # The lock row must exist before two passes race to create it.
    op.bulk_insert(state, [{"id": 1, "mark": None, "locked_at": None}])
    op.create_table(
        "billing_passes",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.Column("finished_at", UTCDateTime, nullable=False),
        sa.Column("window_start", UTCDateTime, nullable=True),
        sa.Column("window_end", UTCDateTime, nullable=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("source_sha256", sa.String(64), nullable=False),
        sa.Column("archive_path", sa.Text, nullable=True),
        sa.Column("sacct_rows", sa.Integer, nullable=False),
        sa.Column("ledger_rows", sa.Integer, nullable=False),
        sa.Column("adjustment_rows", sa.Integer, nullable=False),
    )
    op.create_table(
        "prices",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("unit_price_nanos", sa.BigInteger, nullable=False),
        sa.Column("effective_from", UTCDateTime, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.UniqueConstraint("gpu_type", "effective_from", name="uq_prices_type_from"),
    )
    op.create_table(
        "ledger_entries",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("pass_id", sa.BigInteger, sa.ForeignKey("billing_passes.id"), nullable=False),
        sa.Column("account", sa.String(64), nullable=False),
        sa.Column("cluster", sa.String(64), nullable=False),
        sa.Column("slurm_job_id", sa.String(64), nullable=False),
        sa.Column("job_id_raw", sa.BigInteger, nullable=False),
        sa.Column("run_start", UTCDateTime, nullable=False),
        sa.Column("gpupool_job_id", sa.String(36), nullable=True),
        sa.Column("job_name", sa.Text, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("period", sa.String(7), nullable=False),
        sa.Column("interval_from", UTCDateTime, nullable=False),
        sa.Column("interval_to", UTCDateTime, nullable=False),
        sa.Column("seconds", sa.BigInteger, nullable=False),
        sa.Column("gpu_seconds", sa.BigInteger, nullable=False),
        sa.Column("unit_price_nanos", sa.BigInteger, nullable=False),
        sa.Column("amount_nanos", sa.BigInteger, nullable=False),
        sa.Column("correction", sa.Boolean, nullable=False),
        sa.Column("final", sa.Boolean, nullable=False),
        sa.UniqueConstraint(
            "job_id_raw", "cluster", "run_start", "gpu_type", "interval_from", "correction", name="uq_ledger_run_interval"
        ),
    )
    op.create_index(
        "ix_ledger_invoice",
        "ledger_entries",
        ["account", "period", "cluster", "job_id_raw", "run_start", "gpu_type", "unit_price_nanos"],
    )
    op.create_index("ix_ledger_gpupool_job", "ledger_entries", ["gpupool_job_id"])
    op.create_table(
        "adjustments",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("account", sa.String(64), nullable=False),
        sa.Column("period", sa.String(7), nullable=False),
        sa.Column("amount_nanos", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("source_key", sa.String(255), nullable=True, unique=True),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_adjustments_account_period", "adjustments", ["account", "period"])


def downgrade() -> None:
    op.drop_index("ix_adjustments_account_period", table_name="adjustments")
    op.drop_table("adjustments")
    op.drop_index("ix_ledger_gpupool_job", table_name="ledger_entries")
    op.drop_index("ix_ledger_invoice", table_name="ledger_entries")
    op.drop_table("ledger_entries")
    op.drop_table("prices")
    op.drop_table("billing_passes")
    op.drop_table("billing_state")
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("monthly_limit_nanos")
        batch.drop_column("prepaid_credit_nanos")
