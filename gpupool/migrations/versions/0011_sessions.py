"""sessions: interactive session jobs, their single-use links and cookies, and why a job ended

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # gpupool's own reason for ending a job (an idle session), beside Slurm's state.
    op.add_column("jobs", sa.Column("end_reason", sa.Text, nullable=True))
    op.create_table(
        "job_sessions",
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("label", sa.String(32), nullable=False, unique=True),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("idle_timeout_min", sa.Integer, nullable=False),
        sa.Column("port", sa.Integer, nullable=True),
        sa.Column("ready_at", UTCDateTime, nullable=True),
        sa.Column("last_active_at", UTCDateTime, nullable=True),
        sa.Column("idle_stopped_at", UTCDateTime, nullable=True),
    )
    op.create_table(
        "session_grants",
        sa.Column("value_hash", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("jti", sa.String(64), sa.ForeignKey("issued_tokens.jti"), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
        sa.Column("used_at", UTCDateTime, nullable=True),
    )
    op.create_index("ix_session_grants_job_id", "session_grants", ["job_id"])
    op.create_index("ix_session_grants_jti", "session_grants", ["jti"])
    op.create_index("ix_session_grants_expires_at", "session_grants", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_session_grants_expires_at", table_name="session_grants")
    op.drop_index("ix_session_grants_jti", table_name="session_grants")
    op.drop_index("ix_session_grants_job_id", table_name="session_grants")
    op.drop_table("session_grants")
    op.drop_table("job_sessions")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("end_reason")
