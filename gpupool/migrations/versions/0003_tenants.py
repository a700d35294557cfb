"""tenants: each account's Unix identity

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("accounts", sa.Column("unix_user", sa.String(32), nullable=True))
    op.add_column("accounts", sa.Column("unix_uid", sa.Integer, nullable=True))
    op.create_index("uq_accounts_unix_uid", "accounts", ["unix_uid"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_accounts_unix_uid", table_name="accounts")
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("unix_uid")
        batch.drop_column("unix_user")
