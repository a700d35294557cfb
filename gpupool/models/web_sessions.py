"""Signed-in web page sessions: the cookie carries a random id, the database what it stands for."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime


class WebSession(Base):
    """One sign-in. Keyed on the SHA-256 of the cookie's id, so reading this table yields no usable cookie."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The token pasted at sign-in; its record (subject, role, revocation) decides on every page.
    jti: Mapped[str] = mapped_column(ForeignKey("issued_tokens.jti"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    # The token's expiry: the session ends with it at the latest.
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, index=True)
