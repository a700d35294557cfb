from __future__ import annotations

import datetime as dt

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime, utcnow


class Account(Base):
    """A customer account; mirrors a Slurm account of the same name."""

    __tablename__ = "accounts"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu_limit: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
