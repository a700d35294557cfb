"""Webhook endpoints, the events they are owed, and each attempt to deliver one.

An event is written in the same transaction as the job state it announces;
one delivery row per (event, endpoint) then tracks the attempts, so an event
is sent at least once to every endpoint that wanted it, and never lost.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime, utcnow

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")

PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"  # gave up: retried for the whole retry window
CANCELLED = "cancelled"  # its endpoint was deleted first


class WebhookEndpoint(Base):
    """Where an account wants events sent; ``job_id`` set: a submit's ``callback_url``, for that job only.

    No account: the operator's own endpoint (``gpupool.webhooks.operator``), whose URL and secret
    the sender takes from the site's settings, never from this row.
    """

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_account", "account", "deleted_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    account: Mapped[str | None] = mapped_column(ForeignKey("accounts.name"))
    # A job row dropped because Slurm never took it takes its callback along.
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    url: Mapped[str] = mapped_column(Text)
    # Comma-separated event types, e.g. "job.started,job.ended".
    events: Mapped[str] = mapped_column(String(255))
    # HMAC key; the API shows it once, the sender needs it for every delivery.
    secret: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    def wants(self, event_type: str) -> bool:
        return event_type in self.events.split(",")


class WebhookEvent(Base):
    """Something that happened to a job; ``payload`` is the exact JSON body every endpoint receives."""

    __tablename__ = "webhook_events"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    # None: an event for the operator (node.drained), about no account.
    account: Mapped[str | None] = mapped_column(ForeignKey("accounts.name"))
    # None: an account-level event (budget.threshold), about no job.
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    type: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class WebhookDelivery(Base):
    """One event owed to one endpoint; ``next_attempt_at`` also serves as the sender's claim on it."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("event_id", "endpoint_id", name="uq_webhook_deliveries_event_endpoint"),
        Index("ix_webhook_deliveries_due", "state", "next_attempt_at"),
        Index("ix_webhook_deliveries_endpoint", "endpoint_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("webhook_events.id"))
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id"))
    state: Mapped[str] = mapped_column(String(16), default=PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class WebhookAttempt(Base):
    """One POST to a receiver and what came back (or why nothing did)."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (Index("ix_webhook_attempts_delivery", "delivery_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(BigId, ForeignKey("webhook_deliveries.id"))
    attempted_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    duration_ms: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    response_excerpt: Mapped[str | None] = mapped_column(Text)
