from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import BigInteger, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime, utcnow

# Slurm account names are case-insensitive and stored lower case; keep them plain.
ACCOUNT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class Account(Base):
    """A customer account; mirrors a Slurm account of the same name."""

    __tablename__ = "accounts"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu_limit: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Budgets, in nano-units: total prepaid credit granted, and a spend cap per UTC month.
    prepaid_credit_nanos: Mapped[int | None] = mapped_column(BigInteger)
    monthly_limit_nanos: Mapped[int | None] = mapped_column(BigInteger)
