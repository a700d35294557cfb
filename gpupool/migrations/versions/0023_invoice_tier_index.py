"""ledger: the invoice index ends with the price tier, as invoice lines now group by it

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04

An invoice line groups a run's ledger rows by GPU type, unit price and tier
(``billing.invoice``). With the tier last in the invoice index (now
``ix_ledger_invoice_tier``) PostgreSQL still reads the groups straight off it
in their order, with no sort step between the scan and the CSV; without it, an
incremental sort by tier. The new index is built before the old one is
dropped; billing passes wait for the build.
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

_OLD = ["account", "period", "cluster", "job_id_raw", "run_start", "gpu_type", "unit_price_nanos"]


def upgrade() -> None:
    op.create_index("ix_ledger_invoice_tier", "ledger_entries", [*_OLD, "tier"])
    op.drop_index("ix_ledger_invoice", table_name="ledger_entries")


def downgrade() -> None:
    op.create_index("ix_ledger_invoice", "ledger_entries", _OLD)
    op.drop_index("ix_ledger_invoice_tier", table_name="ledger_entries")
