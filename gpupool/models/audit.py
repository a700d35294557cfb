"""The audit log: who changed what an account may do or spend, through which credential, from where."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime
from gpupool.models.webhooks import BigId


class AuditEvent(Base):
    """One action, written in the transaction that made it; never changed or removed (migration 0022's triggers)."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_account_id", "account", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    # None: an operator's action that concerns no single account (a price).
    account: Mapped[str | None] = mapped_column(String(64))
    # The token's or key's subject; for the operator's command line, "operator:<Unix user>".
    actor: Mapped[str] = mapped_column(String(255))
    # token, key, page (a signed-in web session) or cli.
    via: Mapped[str] = mapped_column(String(16))
    # The token's id or the key's id, never a secret; None for the command line.
    credential: Mapped[str | None] = mapped_column(String(64))
    # The client's address as the API saw it (after the trusted proxy, if any).
    address: Mapped[str | None] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str | None] = mapped_column(String(255))
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON)
