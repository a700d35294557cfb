"""member_identities: each member who runs jobs gets a Unix and Slurm user of their own; jobs record which user ran them

Revision ID: 0027
Revises: 0025
Create Date: 2026-12-05

``member_identities`` holds, per (account, subject), the member's own Unix
user and the uid every host gives it (``gpupool member migrate`` makes them;
the playbook's tenants step reads them from ``gpupool account list --json``).
A row outlives the membership, so jobs of a member who left are still followed
and billed under their user.

``jobs.unix_user`` and ``jobs.unix_uid`` record the user a job was submitted
as. Every job before this migration ran as its account's tenant user, which a
NULL means, so they keep being followed, cancelled and billed as before.

(Written to follow 0025; the lead's 0026 comes between them at merge.)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpupool.db import UTCDateTime

revision = "0027"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "member_identities",
        sa.Column("account", sa.String(64), sa.ForeignKey("accounts.name"), primary_key=True),
        sa.Column("subject", sa.String(255), primary_key=True),
        sa.Column("unix_user", sa.String(32), nullable=False),
        sa.Column("unix_uid", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_index("uq_member_identities_unix_user", "member_identities", ["unix_user"], unique=True)
    op.create_index("uq_member_identities_unix_uid", "member_identities", ["unix_uid"], unique=True)
    # Plain ADD COLUMN, nullable: no table rewrite on either database, whatever the number of jobs.
    op.add_column("jobs", sa.Column("unix_user", sa.String(32), nullable=True))
    op.add_column("jobs", sa.Column("unix_uid", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("unix_uid")
        batch.drop_column("unix_user")
    op.drop_index("uq_member_identities_unix_uid", table_name="member_identities")
    op.drop_index("uq_member_identities_unix_user", table_name="member_identities")
    op.drop_table("member_identities")
