"""webhooks: endpoints, events and deliveries

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("account", sa.String(64), sa.ForeignKey("accounts.name"), nullable=False),
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=True, unique=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("events", sa.String(255), nullable=False),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("deleted_at", UTCDateTime, nullable=True),
    )
    op.create_index("ix_webhook_endpoints_account", "webhook_endpoints", ["account", "deleted_at"])
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account", sa.String(64), sa.ForeignKey("accounts.name"), nullable=False),
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_webhook_events_job_id", "webhook_events", ["job_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(40), sa.ForeignKey("webhook_events.id"), nullable=False),
        sa.Column("endpoint_id", sa.String(36), sa.ForeignKey("webhook_endpoints.id"), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", UTCDateTime, nullable=False),
        sa.Column("delivered_at", UTCDateTime, nullable=True),
        sa.UniqueConstraint("event_id", "endpoint_id", name="uq_webhook_deliveries_event_endpoint"),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["state", "next_attempt_at"])
    op.create_index("ix_webhook_deliveries_endpoint", "webhook_deliveries", ["endpoint_id", "id"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("delivery_id", BigId, sa.ForeignKey("webhook_deliveries.id"), nullable=False),
        sa.Column("attempted_at", UTCDateTime, nullable=False),
        sa.Column("duration_ms", sa.Integer, nullable=False),
        sa.Column("status_code", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("response_excerpt", sa.Text, nullable=True),
    )
    op.create_index("ix_webhook_attempts_delivery", "webhook_attempts", ["delivery_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_webhook_attempts_delivery", table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_deliveries_endpoint", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhook_events_job_id", table_name="webhook_events")
    op.drop_table("webhook_events")
    op.drop_index("ix_webhook_endpoints_account", table_name="webhook_endpoints")
    op.drop_table("webhook_endpoints")
