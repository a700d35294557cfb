from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime, utcnow

# Slurm account names are case-insensitive and stored lower case; keep them plain.
ACCOUNT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class Account(Base):
    """A customer account; mirrors a Slurm account of the same name."""

    __tablename__ = "accounts"
    # One uid per tenant on every host: the playbook creates users from these rows.
    __table_args__ = (Index("uq_accounts_unix_uid", "unix_uid", unique=True),)

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu_limit: Mapped[int | None] = mapped_column(Integer)
    # Jobs pending or running at once, array tasks one by one (Slurm's GrpSubmitJobs); None: the site's max_submit_jobs.
    max_submit_jobs: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Budgets, in nano-units: total prepaid credit granted, and a spend cap per UTC month.
    prepaid_credit_nanos: Mapped[int | None] = mapped_column(BigInteger)
    monthly_limit_nanos: Mapped[int | None] = mapped_column(BigInteger)
    # The Unix user every job of the account runs as (gpupool.slurm.tenants).
    unix_user: Mapped[str | None] = mapped_column(String(32))
    unix_uid: Mapped[int | None] = mapped_column(Integer)
    # The size of the account's own storage, its quota (gpupool.storage.volumes); None: the site's storage_default_quota.
    storage_quota_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # Set by `gpupool account disable`: its tokens are refused from then on.
    disabled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    def storage_quota(self, site_default: int) -> int:
        """The size of the account's storage, in bytes."""
        return self.storage_quota_bytes if self.storage_quota_bytes is not None else site_default

    def submit_job_limit(self, site_default: int) -> int:
        """The most jobs (array tasks one by one) the account may have pending or running at once."""
        return self.max_submit_jobs if self.max_submit_jobs is not None else site_default
