"""tokens: revocable token ids, disabled accounts

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("accounts", sa.Column("disabled_at", UTCDateTime, nullable=True))
    op.create_table(
        "issued_tokens",
        sa.Column("jti", sa.String(64), primary_key=True),
        sa.Column("account", sa.String(64), sa.ForeignKey("accounts.name"), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("issued_at", UTCDateTime, nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
        sa.Column("revoked_at", UTCDateTime, nullable=True),
        sa.Column("revoked_by", sa.String(255), nullable=True),
        sa.Column("revoke_reason", sa.Text, nullable=True),
    )
    op.create_index("ix_issued_tokens_account", "issued_tokens", ["account"])


def downgrade() -> None:
    op.drop_index("ix_issued_tokens_account", table_name="issued_tokens")
    op.drop_table("issued_tokens")
    # batch mode: SQLite rebuilds the table to drop a column.
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("disabled_at")
