"""The people inside an account: token subjects with a role and optional limits of their own."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, BigInteger, CheckConstraint, ForeignKey, Integer, String
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
