"""accounts.max_submit_jobs: an account's own cap on jobs pending or running at once

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-04

Slurm holds the cap (GrpSubmitJobs on the account's association, every array
task counted as a job); this column is the operator's override of the site's
``max_submit_jobs`` for one account (``gpupool account set NAME
--max-submit-jobs N``). NULL: the site's default, which is what every account
made before this revision gets.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("accounts", sa.Column("max_submit_jobs", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("max_submit_jobs")
