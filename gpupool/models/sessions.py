"""Interactive sessions: a job serving a web app through gpupool's proxy (gpupool.sessions)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime

LINK = "link"
COOKIE = "cookie"


class JobSession(Base):
    """The session side of a job of a session template: its origin, its secret, where it listens."""

    __tablename__ = "job_sessions"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    # The first label of the session's own origin, https://<label>.<sessions domain>/: random, never the job id.
    label: Mapped[str] = mapped_column(String(32), unique=True)
    # Known to the proxy (through the auth answer) and the job (its 0600 file) alone.
    secret: Mapped[str] = mapped_column(String(128))
    idle_timeout_min: Mapped[int] = mapped_column(Integer)
    # What the job wrote into its port file, once it was a valid port of the operator's range.
    port: Mapped[int | None] = mapped_column(Integer)
    ready_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # The last byte through the shim, as its status said when the idle stop last asked.
    last_active_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    idle_stopped_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class SessionGrant(Base):
    """A single-use link to a session, or the cookie that link set on the session's origin.

    Keyed on the SHA-256 of the value the browser holds, so this table yields no usable link or cookie.
    """

    __tablename__ = "session_grants"

    value_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    # The token that asked for the link: its revocation or its account's disabling ends the grant.
    jti: Mapped[str] = mapped_column(ForeignKey("issued_tokens.jti"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, index=True)
    used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
