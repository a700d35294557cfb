"""What the operator paid for each node, for the report's payback figures."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime, utcnow


class NodeCost(Base):
    """One Slurm node's hardware: purchase price (nano-units), in service since, power draw."""

    __tablename__ = "node_costs"

    node: Mapped[str] = mapped_column(String(64), primary_key=True)  # as sinfo names it
    purchase_price_nanos: Mapped[int] = mapped_column(BigInteger)
    # Cost and payback count from here: electricity accrues from this moment on.
    in_service_since: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    # Average draw of the whole box under load, in watts.
    watts: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class NodeHealthEvent(Base):
    """A drain gpupool-gpu-check made (reason "gpu: ..."), as a billing pass first saw it; once per node and drain."""

    __tablename__ = "node_health_events"
    __table_args__ = (UniqueConstraint("node", "drained_at", name="uq_node_health_once"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    # When Slurm set the reason (sinfo's reason_changed_at): a new drain of the node is a new event.
    drained_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    seen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    # The first pass that found the node in service again (or drained for another reason).
    resumed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    billing_pass_id: Mapped[int | None] = mapped_column(Integer)
