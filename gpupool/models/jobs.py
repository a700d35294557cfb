from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, UniqueConstraint, false
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.db import Base, UTCDateTime, utcnow
from gpupool.render import job_tag

# The row exists but sbatch has not (yet) confirmed a Slurm job id.
SUBMITTING = "SUBMITTING"
# gpupool's verdict, not a Slurm state: neither squeue nor sacct has answered for the job
# in ``unknown_after_s`` (sacct purged it, or slurmdbd never got it). It ends the job's tracking.
UNKNOWN = "UNKNOWN"
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)


class Job(Base):
    """A job submitted through the API, with the last state read from Slurm."""

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("account", "owner", "idempotency_key", name="uq_jobs_idempotency"),
        Index("ix_jobs_account_created", "account", "created_at", "id"),
        # GET /jobs?state=...: one range per state, already in page order.
        Index("ix_jobs_account_state_created", "account", "state", "created_at", "id"),
        Index("ix_jobs_unfinished", "finished", "state"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    account: Mapped[str] = mapped_column(ForeignKey("accounts.name"))
    owner: Mapped[str] = mapped_column(String(255))
    # The Unix and Slurm user the job was submitted as: its owner's own (gpupool.models.members.MemberIdentity),
    # or None: the account's tenant user (every job from before members had users of their own).
    unix_user: Mapped[str | None] = mapped_column(String(32))
    unix_uid: Mapped[int | None] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(128))
    template: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    cpus: Mapped[int] = mapped_column(Integer)
    mem_gb: Mapped[int] = mapped_column(Integer)
    time_limit_min: Mapped[int] = mapped_column(Integer)
    container_image: Mapped[str | None] = mapped_column(String(512))
    job_dir: Mapped[str] = mapped_column(Text)

    slurm_job_id: Mapped[int | None] = mapped_column(Integer, index=True)
    state: Mapped[str] = mapped_column(String(32), default=SUBMITTING)
    finished: Mapped[bool] = mapped_column(default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    exit_signal: Mapped[int | None] = mapped_column(Integer)
    node: Mapped[str | None] = mapped_column(String(255))
    submitted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    elapsed_s: Mapped[int | None] = mapped_column(Integer)
    # A pending job's START_TIME in the refresher's squeue: the scheduler's estimate; None: none, or not pending.
    expected_start_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # gpupool's reason for ending the job, when it was gpupool (an idle session's stop), beside Slurm's state.
    end_reason: Mapped[str | None] = mapped_column(Text)
    # An array job (sbatch --array=0-<array_size - 1>%<array_max_parallel>); None: a single job.
    array_size: Mapped[int | None] = mapped_column(Integer)
    array_max_parallel: Mapped[int | None] = mapped_column(Integer)
    # A sweep's parameter name and its values, task i's at index i: {"param": ..., "values": [...]}.
    sweep: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # An array job's tasks per state, as the refresher last wrote them with the tasks' own rows:
    # a read of the job is one row however many tasks it has. None: a single job.
    task_states: Mapped[dict[str, int] | None] = mapped_column(JSON)
    # Asked for as spot: submitted to the spot QOS, which any full-price job may preempt (requeue).
    preemptible: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Asked for requeue_on_failure (a spot job always is): sbatch --requeue, so the GPU check
    # requeues the job onto a healthy node when its GPU fails, rather than cancelling it.
    # The database's default alone (no Python one): an INSERT that does not name it is one a database
    # from before migration 0031 takes too (tests/billing/test_spend_totals.py inserts at 0024).
    requeue_on_failure: Mapped[bool] = mapped_column(server_default=false())
    # Runs Slurm has started so far (a preempted job runs again after its requeue).
    run_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Idle GPUs (gpupool.gpu_usage.idle): since when every GPU of the running job has been under its
    # policy's threshold (None: busy, or not judged), when job.idle was sent, and when gpupool cancelled
    # it for that (the reason the customer reads is end_reason).
    idle_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    idle_notified_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    idle_cancelled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    submit_attempted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # When squeue or sacct last answered for the job (to within 1% of unknown_after_s); None: not since submission.
    last_seen_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    @property
    def tag(self) -> str:
        return job_tag(self.id)


class JobTask(Base):
    """One task of an array job, with the last state Slurm gave for it (``gpupool.jobstate``)."""

    __tablename__ = "job_tasks"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    task_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The task's own Slurm job id (JobIDRaw) once sacct has named it; squeue shows only <array id>_<index>.
    slurm_job_id: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32), default="PENDING")
    finished: Mapped[bool] = mapped_column(default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    exit_signal: Mapped[int | None] = mapped_column(Integer)
    node: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    elapsed_s: Mapped[int | None] = mapped_column(Integer)


class SlurmSync(Base):
    """Single-row lease: whoever moves ``started_at`` forward runs the batched refresh."""

    __tablename__ = "slurm_sync"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
