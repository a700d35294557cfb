"""requeue on GPU failure; the operator's webhook

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-05

A job may ask to be requeued when the GPU check ends it (``jobs.requeue_on_failure``,
rendered as sbatch ``--requeue``). The operator hears of each GPU drain by
webhook as well as by email: the drain's ``node.drained`` event goes through the
customers' outbox to one endpoint that belongs to no account (``operator``),
whose URL and secret are site settings the sender reads
(``operator_webhook_url``, ``operator_webhook_secret``), never stored here. So an
endpoint's and an event's account may now be empty.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

# gpupool.webhooks.operator.OPERATOR_ENDPOINT_ID, spelled here: a migration never changes with the code.
_OPERATOR = "operator"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("requeue_on_failure", sa.Boolean, nullable=False, server_default=sa.false()))
    with op.batch_alter_table("webhook_endpoints") as batch:
        batch.alter_column("account", existing_type=sa.String(64), nullable=True)
    with op.batch_alter_table("webhook_events") as batch:
        batch.alter_column("account", existing_type=sa.String(64), nullable=True)
    endpoints = sa.table(
        "webhook_endpoints", sa.column("id", sa.String), sa.column("account", sa.String), sa.column("job_id", sa.String),
        sa.column("url", sa.Text), sa.column("events", sa.String), sa.column("secret", sa.String),
        sa.column("created_at", UTCDateTime),
    )
    op.bulk_insert(endpoints, [{
        "id": _OPERATOR, "account": None, "job_id": None, "url": "", "events": "node.drained", "secret": "",
        "created_at": dt.datetime.now(dt.UTC),
    }])


def downgrade() -> None:
    op.execute(
        "DELETE FROM webhook_attempts WHERE delivery_id IN "
        "(SELECT id FROM webhook_deliveries WHERE event_id IN (SELECT id FROM webhook_events WHERE account IS NULL))"
    )
    op.execute("DELETE FROM webhook_deliveries WHERE event_id IN (SELECT id FROM webhook_events WHERE account IS NULL)")
    op.execute("DELETE FROM webhook_events WHERE account IS NULL")
    op.execute(f"DELETE FROM webhook_endpoints WHERE id = '{_OPERATOR}'")
    with op.batch_alter_table("webhook_events") as batch:
        batch.alter_column("account", existing_type=sa.String(64), nullable=False)
    with op.batch_alter_table("webhook_endpoints") as batch:
        batch.alter_column("account", existing_type=sa.String(64), nullable=False)
    op.drop_column("jobs", "requeue_on_failure")
