"""Every token ``gpupool token create`` signed, so it can be listed and revoked."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime

# uuid4 hex is 32 characters; the column leaves room for another issuer's ids.
JTI_LENGTH = 64


class IssuedToken(Base):
    """One signed token, keyed on its ``jti`` claim. The API refuses tokens without a row."""

    __tablename__ = "issued_tokens"

    jti: Mapped[str] = mapped_column(String(JTI_LENGTH), primary_key=True)
    account: Mapped[str] = mapped_column(ForeignKey("accounts.name"), index=True)
    subject: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))
    issued_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    revoked_by: Mapped[str | None] = mapped_column(String(255))
    revoke_reason: Mapped[str | None] = mapped_column(Text)
