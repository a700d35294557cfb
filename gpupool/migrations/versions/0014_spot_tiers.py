"""spot: price tiers, each ledger row's tier, preemptible jobs

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

A price belongs to a tier, named after the Slurm QOS whose runs pay it; every
price set before tiers existed is the full price of QOS ``normal``. A ledger
row records the tier it was priced at (existing rows: ``normal``, the only
tier there was), so the operator report can sum revenue by tier.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("prices") as batch:
        batch.add_column(sa.Column("tier", sa.String(32), nullable=False, server_default="normal"))
        batch.drop_constraint("uq_prices_type_from", type_="unique")
        batch.create_unique_constraint("uq_prices_tier_type_from", ["tier", "gpu_type", "effective_from"])
    # A column added with a default rewrites no row: the append-only triggers see no UPDATE.
    op.add_column("ledger_entries", sa.Column("tier", sa.String(32), nullable=False, server_default="normal"))
    op.add_column("jobs", sa.Column("preemptible", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("jobs", sa.Column("run_count", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("jobs", "run_count")
    op.drop_column("jobs", "preemptible")
    op.drop_column("ledger_entries", "tier")
    with op.batch_alter_table("prices") as batch:
        batch.drop_constraint("uq_prices_tier_type_from", type_="unique")
        batch.create_unique_constraint("uq_prices_type_from", ["gpu_type", "effective_from"])
        batch.drop_column("tier")
