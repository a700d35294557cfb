"""job arrays: an array job's size, throttle and sweep values, and its tasks' states

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("array_size", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("array_max_parallel", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("sweep", sa.JSON, nullable=True))
    op.create_table(
        "job_tasks",
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("task_index", sa.Integer, primary_key=True),
        sa.Column("slurm_job_id", sa.Integer, nullable=True),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("finished", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("exit_signal", sa.Integer, nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("started_at", UTCDateTime, nullable=True),
        sa.Column("ended_at", UTCDateTime, nullable=True),
        sa.Column("elapsed_s", sa.Integer, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("job_tasks")
    op.drop_column("jobs", "sweep")
    op.drop_column("jobs", "array_max_parallel")
    op.drop_column("jobs", "array_size")
