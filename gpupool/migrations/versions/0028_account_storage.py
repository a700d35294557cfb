"""accounts.storage_quota_bytes: the size of an account's own storage

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-04

Each account's storage is a filesystem of its own whose size is its quota
(gpupool.storage.volumes); this column is the operator's quota for one
account (`gpupool account create NAME --storage-quota 500G`, `gpupool account
set NAME --storage-quota 1T`). NULL: the site's storage_default_quota, which is
what every account made before this revision gets.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("accounts", sa.Column("storage_quota_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("storage_quota_bytes")
