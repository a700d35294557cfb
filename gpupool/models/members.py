"""The people inside an account: token subjects with a role and optional limits of their own."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, BigInteger, CheckConstraint, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime

MEMBER_ROLES = ("admin", "member", "viewer")


class AccountMember(Base):
    """One subject of an account. An account with no rows here treats every one of its tokens as its admin."""

    __tablename__ = "account_members"
    __table_args__ = (
        CheckConstraint("role IN ('admin', 'member', 'viewer')", name="ck_account_members_role"),
        CheckConstraint("gpu_limit IS NULL OR gpu_limit >= 0", name="ck_account_members_gpu_limit"),
        CheckConstraint("monthly_limit_nanos IS NULL OR monthly_limit_nanos >= 0", name="ck_account_members_monthly"),
    )

    account: Mapped[str] = mapped_column(ForeignKey("accounts.name"), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255), primary_key=True)  # the width of jobs.owner
    role: Mapped[str] = mapped_column(String(16))
    # Limits of this member alone, inside the account's own: None means only the account's.
    gpu_limit: Mapped[int | None] = mapped_column(Integer)
    monthly_limit_nanos: Mapped[int | None] = mapped_column(BigInteger)
    templates: Mapped[list[str] | None] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class MemberIdentity(Base):
    """A member's own Unix user and Slurm user, under the account's association (gpupool.slurm.tenants).

    Made by ``gpupool member migrate`` (root) for each member who runs jobs, with
    a uid from the tenant range recorded here so that every host (the playbook's
    tenants step) makes the same user. Kept when the member is taken out of the
    account or made a viewer: their jobs are still followed and billed under
    that user, whose Slurm limits are then 0.
    """

    __tablename__ = "member_identities"
    __table_args__ = (
        Index("uq_member_identities_unix_user", "unix_user", unique=True),
        Index("uq_member_identities_unix_uid", "unix_uid", unique=True),
    )

    account: Mapped[str] = mapped_column(ForeignKey("accounts.name"), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255), primary_key=True)
    unix_user: Mapped[str] = mapped_column(String(32))
    unix_uid: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
