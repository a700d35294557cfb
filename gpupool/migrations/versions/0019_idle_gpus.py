"""idle GPUs: recent per-GPU samples of jobs, the operator's idle policies, a job's idle state

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02

``gpupool idle check`` (every minute) records each running gpupool job's GPUs
as their nodes' exporters read them in ``gpu_samples`` (pruned after
``idle_sample_retention_min``), judges them against the job's policy
(``idle_policies``: per account, per template, or the settings' default), and
keeps the verdict on the job: ``idle_since``, ``idle_notified_at`` (job.idle
sent) and ``idle_cancelled_at`` (gpupool cancelled it; ``end_reason`` says why).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("sampled_at", UTCDateTime, nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("gpu_index", sa.Integer, nullable=False),
        sa.Column("utilization_pct", sa.Float, nullable=True),
        sa.Column("memory_used_mib", sa.Float, nullable=True),
    )
    op.create_index("ix_gpu_samples_job_time", "gpu_samples", ["job_id", "sampled_at"])
    op.create_index("ix_gpu_samples_time", "gpu_samples", ["sampled_at"])
    op.create_table(
        "idle_policies",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("window_min", sa.Integer, nullable=False),
        sa.Column("threshold_pct", sa.Integer, nullable=False),
        sa.Column("grace_min", sa.Integer, nullable=False),
        sa.Column("cancel", sa.Boolean, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.UniqueConstraint("scope", "name", name="uq_idle_policies_scope_name"),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("idle_since", UTCDateTime, nullable=True))
        batch.add_column(sa.Column("idle_notified_at", UTCDateTime, nullable=True))
        batch.add_column(sa.Column("idle_cancelled_at", UTCDateTime, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("idle_cancelled_at")
        batch.drop_column("idle_notified_at")
        batch.drop_column("idle_since")
    op.drop_table("idle_policies")
    op.drop_index("ix_gpu_samples_time", table_name="gpu_samples")
    op.drop_index("ix_gpu_samples_job_time", table_name="gpu_samples")
    op.drop_table("gpu_samples")
