"""spend alerts: an optional run-out forecast per account

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02

``alert_settings.forecast_hours``: alert (``budget.forecast``) when, at the
last 24 hours' spend rate, the credit or limit left lasts fewer hours; null
(every existing row) is off. Fired forecasts are ``alerts_sent`` rows of
kind ``forecast``, under the same unique key.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("alert_settings") as batch:
        batch.add_column(sa.Column("forecast_hours", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alert_settings") as batch:
        batch.drop_column("forecast_hours")
