"""account members: token subjects with a role (admin, member, viewer) and limits of their own

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02

An account without rows here keeps today's behaviour (each of its tokens acts
as the account's admin); once it has members, a subject not listed is refused.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "account_members",
        sa.Column("account", sa.String(64), sa.ForeignKey("accounts.name"), primary_key=True),
        sa.Column("subject", sa.String(255), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("gpu_limit", sa.Integer(), nullable=True),
        sa.Column("monthly_limit_nanos", sa.BigInteger(), nullable=True),
        sa.Column("templates", sa.JSON(), nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.CheckConstraint("role IN ('admin', 'member', 'viewer')", name="ck_account_members_role"),
        sa.CheckConstraint("gpu_limit IS NULL OR gpu_limit >= 0", name="ck_account_members_gpu_limit"),
        sa.CheckConstraint("monthly_limit_nanos IS NULL OR monthly_limit_nanos >= 0", name="ck_account_members_monthly"),
    )


def downgrade() -> None:
    op.drop_table("account_members")
