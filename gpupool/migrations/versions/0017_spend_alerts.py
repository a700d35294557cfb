"""spend alerts: thresholds per account, the alerts sent, and an email outbox

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02

A billing pass whose rows cross an account's threshold (50, 80, 100 % of its
prepaid credit or monthly limit by default) records one ``alerts_sent`` row,
unique per account, kind, threshold and period, so a rerun fires nothing
again; it enqueues a ``budget.threshold`` webhook event (not about a job:
``webhook_events.job_id`` becomes optional) and an email in ``email_outbox``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_settings",
        sa.Column("account", sa.String(64), sa.ForeignKey("accounts.name"), primary_key=True),
        sa.Column("thresholds", sa.String(64), nullable=False),
        sa.Column("email", sa.String(254), nullable=True),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )
    with op.batch_alter_table("webhook_events") as batch:
        batch.alter_column("job_id", existing_type=sa.String(36), nullable=True)
    op.create_table(
        "alerts_sent",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("account", sa.String(64), sa.ForeignKey("accounts.name"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("threshold", sa.Integer, nullable=False),
        sa.Column("period_key", sa.String(64), nullable=False),
        sa.Column("used_nanos", sa.BigInteger, nullable=False),
        sa.Column("total_nanos", sa.BigInteger, nullable=False),
        sa.Column("billing_pass_id", sa.Integer, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.UniqueConstraint("account", "kind", "threshold", "period_key", name="uq_alerts_sent_once"),
    )
    op.create_table(
        "email_outbox",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("account", sa.String(64), sa.ForeignKey("accounts.name"), nullable=False),
        sa.Column("recipient", sa.String(254), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", UTCDateTime, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("sent_at", UTCDateTime, nullable=True),
    )
    op.create_index("ix_email_outbox_due", "email_outbox", ["state", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index("ix_email_outbox_due", table_name="email_outbox")
    op.drop_table("email_outbox")
    op.drop_table("alerts_sent")
    with op.batch_alter_table("webhook_events") as batch:
        batch.alter_column("job_id", existing_type=sa.String(36), nullable=False)
    op.drop_table("alert_settings")
