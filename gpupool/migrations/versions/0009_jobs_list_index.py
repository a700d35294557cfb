"""jobs: an index for listing one account's jobs in one state, newest first

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # GET /jobs?state=...: the account and the state pick a range already in page order.
    op.create_index("ix_jobs_account_state_created", "jobs", ["account", "state", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_account_state_created", table_name="jobs")
