"""Spend alerts sent (once each, by their unique key) and the email outbox that delivers them."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime
from gpupool.models.webhooks import BigId

EMAIL_PENDING = "pending"
EMAIL_SENT = "sent"
EMAIL_FAILED = "failed"  # gave up after email_max_attempts


DEFAULT_THRESHOLDS = (50, 80, 100)


class AlertSettings(Base):
    """An account's spend-alert thresholds (set by the account or the operator) and email recipient (the operator's)."""

    __tablename__ = "alert_settings"

    account: Mapped[str] = mapped_column(ForeignKey("accounts.name"), primary_key=True)
    # Percentages of the credit / limit consumed, comma-separated, ascending.
    thresholds: Mapped[str] = mapped_column(String(64))
    email: Mapped[str | None] = mapped_column(String(254))
    # Run-out forecast: alert when, at the last 24 hours' rate, the budget lasts fewer hours. None: off.
    forecast_hours: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class AlertSent(Base):
    """One threshold crossed: ``period_key`` is the month (limit) or the credit granted (credit)."""

    __tablename__ = "alerts_sent"
    __table_args__ = (UniqueConstraint("account", "kind", "threshold", "period_key", name="uq_alerts_sent_once"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    account: Mapped[str] = mapped_column(ForeignKey("accounts.name"))
    kind: Mapped[str] = mapped_column(String(16))  # "credit", "limit" or "forecast" (threshold: its hours)
    threshold: Mapped[int] = mapped_column(Integer)
    period_key: Mapped[str] = mapped_column(String(64))
    used_nanos: Mapped[int] = mapped_column(BigInteger)
    total_nanos: Mapped[int] = mapped_column(BigInteger)
    billing_pass_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class EmailOutbox(Base):
    """An email owed; the sender retries it with backoff, like a webhook delivery."""

    __tablename__ = "email_outbox"
    __table_args__ = (Index("ix_email_outbox_due", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    # None: an email to the operator (a node's GPU drain, billing.node_health), about no account.
    account: Mapped[str | None] = mapped_column(ForeignKey("accounts.name"))
    recipient: Mapped[str] = mapped_column(String(254))
    subject: Mapped[str] = mapped_column(String(255))
    body: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default=EMAIL_PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    sent_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
