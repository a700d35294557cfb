"""accounts, jobs and the Slurm refresh lease

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("gpu_limit", sa.Integer, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("account", sa.String(64), sa.ForeignKey("accounts.name"), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("template", sa.String(64), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=True),
        sa.Column("cpus", sa.Integer, nullable=False),
        sa.Column("mem_gb", sa.Integer, nullable=False),
        sa.Column("time_limit_min", sa.Integer, nullable=False),
        sa.Column("container_image", sa.String(512), nullable=True),
        sa.Column("job_dir", sa.Text, nullable=False),
        sa.Column("slurm_job_id", sa.Integer, nullable=True),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("finished", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("exit_signal", sa.Integer, nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("submitted_at", UTCDateTime, nullable=True),
        sa.Column("started_at", UTCDateTime, nullable=True),
        sa.Column("ended_at", UTCDateTime, nullable=True),
        sa.Column("elapsed_s", sa.Integer, nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("submit_attempted_at", UTCDateTime, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.UniqueConstraint("account", "owner", "idempotency_key", name="uq_jobs_idempotency"),
    )
    op.create_index("ix_jobs_slurm_job_id", "jobs", ["slurm_job_id"])
    op.create_index("ix_jobs_account_created", "jobs", ["account", "created_at", "id"])
    op.create_index("ix_jobs_unfinished", "jobs", ["finished", "state"])
    op.create_table(
        "slurm_sync",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.Column("finished_at", UTCDateTime, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("slurm_sync")
    op.drop_index("ix_jobs_unfinished", table_name="jobs")
    op.drop_index("ix_jobs_account_created", table_name="jobs")
    op.drop_index("ix_jobs_slurm_job_id", table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("accounts")
