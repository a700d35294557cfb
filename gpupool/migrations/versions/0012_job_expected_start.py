"""jobs: Slurm's expected start of each pending job, as the refresher's squeue reads it

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for every job so far: the next refresh fills in each pending job's estimate.
    op.add_column("jobs", sa.Column("expected_start_at", UTCDateTime, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("expected_start_at")
