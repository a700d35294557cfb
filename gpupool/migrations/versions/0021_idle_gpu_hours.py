"""idle GPU-hours: each job's idle GPU-seconds per UTC hour, for the operator report

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03

``gpupool idle check`` measures, for every GPU of a running job, the time
between consecutive samples spent under the job's idle threshold
(``gpupool.gpu_usage.idle_time``) and keeps it here per job and UTC hour, in
the pass's transaction: ``gpu_samples`` are pruned, these rows stay. The
report's idle GPU-hours by account and template (``billing.report.idle``) are
their sums over the window. Nothing is measured for the time before this
revision.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idle_gpu_hours",
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("hour", UTCDateTime, primary_key=True),
        sa.Column("idle_gpu_seconds", sa.Float, nullable=False),
    )
    op.create_index("ix_idle_gpu_hours_hour", "idle_gpu_hours", ["hour"])


def downgrade() -> None:
    op.drop_index("ix_idle_gpu_hours_hour", table_name="idle_gpu_hours")
    op.drop_table("idle_gpu_hours")
