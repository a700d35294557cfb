"""node health: each GPU-check drain a billing pass saw, once; operator email without an account

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-04

gpupool-gpu-check drains a node with a reason that starts "gpu: ". Each billing
pass reads the nodes' states and reasons (``sinfo --json``) and records each such
drain once (``node_health_events``, unique per node and the time Slurm set the
reason), emailing the operator about it through the spend alerts' outbox, and
notes when the node is back in service: the operator report's hours drained.
An email to the operator concerns no account, so ``email_outbox.account`` may
now be empty.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_health_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("drained_at", UTCDateTime, nullable=False),
        sa.Column("seen_at", UTCDateTime, nullable=False),
        sa.Column("resumed_at", UTCDateTime, nullable=True),
        sa.Column("billing_pass_id", sa.Integer, nullable=True),
        sa.UniqueConstraint("node", "drained_at", name="uq_node_health_once"),
    )
    with op.batch_alter_table("email_outbox") as batch:
        batch.alter_column("account", existing_type=sa.String(64), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM email_outbox WHERE account IS NULL")
    with op.batch_alter_table("email_outbox") as batch:
        batch.alter_column("account", existing_type=sa.String(64), nullable=False)
    op.drop_table("node_health_events")
