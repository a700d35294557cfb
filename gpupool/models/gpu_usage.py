"""Recent per-GPU samples of gpupool jobs, their idle GPU-seconds per hour, and the operator's idle policies
(``gpupool.gpu_usage.idle``, ``gpupool.gpu_usage.idle_time``)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Boolean, Float, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime
from gpupool.models.webhooks import BigId

ACCOUNT = "account"
TEMPLATE = "template"
POLICY_SCOPES = (ACCOUNT, TEMPLATE)


class GpuSample(Base):
    """One GPU of a job as its node's exporter read it at ``sampled_at``; pruned after the retention."""

    __tablename__ = "gpu_samples"
    __table_args__ = (
        Index("ix_gpu_samples_job_time", "job_id", "sampled_at"),
        Index("ix_gpu_samples_time", "sampled_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    sampled_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    node: Mapped[str] = mapped_column(String(255))
    gpu_index: Mapped[int] = mapped_column(Integer)
    # None: the exporter answered for the GPU without this value.
    utilization_pct: Mapped[float | None] = mapped_column(Float)
    memory_used_mib: Mapped[float | None] = mapped_column(Float)


class IdleGpuHour(Base):
    """A job's idle GPU-seconds in one UTC hour, as the idle check measured them (``gpupool.gpu_usage.idle_time``).

    Kept after the samples are pruned: the operator report's idle GPU-hours are these rows.
    """

    __tablename__ = "idle_gpu_hours"
    __table_args__ = (Index("ix_idle_gpu_hours_hour", "hour"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    # The hour's first instant (UTC).
    hour: Mapped[dt.datetime] = mapped_column(UTCDateTime, primary_key=True)
    # Summed over the job's GPUs; fractions of a second stay, so hours split at their edges add up.
    idle_gpu_seconds: Mapped[float] = mapped_column(Float)


class IdlePolicy(Base):
    """The operator's idle policy for one account or one template; an account's beats a template's."""

    __tablename__ = "idle_policies"
    __table_args__ = (UniqueConstraint("scope", "name", name="uq_idle_policies_scope_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(16))  # "account" or "template"
    name: Mapped[str] = mapped_column(String(64))
    # 0: never judged idle (the policy turns idle detection off for its jobs).
    window_min: Mapped[int] = mapped_column(Integer)
    threshold_pct: Mapped[int] = mapped_column(Integer)
    grace_min: Mapped[int] = mapped_column(Integer)
    cancel: Mapped[bool] = mapped_column(Boolean)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
