"""API keys customers make themselves: scoped, expiring, stored as a hash of their secret."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime


class ApiKey(Base):
    """One key; the secret itself is never stored, only its SHA-256."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    account: Mapped[str] = mapped_column(ForeignKey("accounts.name"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(16))
    templates: Mapped[list[str] | None] = mapped_column(JSON)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
