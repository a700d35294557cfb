"""jobs: when Slurm last answered for each, so jobs it never reports again can be marked UNKNOWN

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for every job so far: the refresher counts from the row's last update until Slurm answers.
    op.add_column("jobs", sa.Column("last_seen_at", UTCDateTime, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("last_seen_at")
