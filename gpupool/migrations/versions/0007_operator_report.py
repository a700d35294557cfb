"""operator report: hardware cost per node

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_costs",
        sa.Column("node", sa.String(64), primary_key=True),
        sa.Column("purchase_price_nanos", sa.BigInteger, nullable=False),
        sa.Column("in_service_since", UTCDateTime, nullable=False),
        sa.Column("watts", sa.Integer, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("node_costs")
