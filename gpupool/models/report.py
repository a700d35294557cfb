"""What the operator paid for each node, for the report's payback figures."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, Integer, String
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
