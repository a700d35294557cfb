"""A job as the API shows it: its JSON view, array counts and recent GPU usage."""

from __future__ import annotations

import datetime as dt
from typing import Any

from api.context import app_state, db_session
from api.schemas import GpuSeriesOut, GpuUsageOut, JobOut, TaskCounts
from gpupool.db import utcnow
from gpupool.gpu_usage.idle import recent_usage
from gpupool.jobstate import NOT_REPORTED, SUBMISSION_LOST
from gpupool.models import Job
from gpupool.models.jobs import SUBMITTING


def _array_view(job: Job) -> TaskCounts | None:
    if job.array_size is None:
        return None
    return TaskCounts(
        count=job.array_size,
        max_parallel=job.array_max_parallel,
        sweep_param=(job.sweep or {}).get("param"),
        states=dict(sorted((job.task_states or {}).items())),
    )


def usage_view(job: Job) -> GpuUsageOut:
    return GpuUsageOut(
        idle_since=job.idle_since,
        idle_notified_at=job.idle_notified_at,
        idle_cancelled_at=job.idle_cancelled_at,
        gpus=[GpuSeriesOut.model_validate(series) for series in recent_usage(db_session(), job)],
    )


# JobOut's fields that show the job's column of the same name as it is stored.
_AS_STORED = (
    "name", "account", "template", "params", "slurm_job_id", "gpus", "gpu_type", "cpus", "mem_gb", "time_limit_min",
    "container_image", "node", "submitted_at", "started_at", "ended_at", "exit_code", "exit_signal", "end_reason",
    "preemptible", "requeue_on_failure", "run_count",
)


def job_view(
    job: Job, now: dt.datetime | None = None, *, queue_position: int | None = None, usage: GpuUsageOut | None = None
) -> dict[str, Any]:
    state_word = job.state
    reason = job.reason
    if state_word == SUBMITTING:
        state_word, reason = "PENDING", "Submitting"
    elapsed = job.elapsed_s
    if elapsed is None and job.started_at is not None:
        end = job.ended_at or now or utcnow()
        elapsed = max(0, int((end - job.started_at).total_seconds()))
    return JobOut(
        **{column: getattr(job, column) for column in _AS_STORED},
        job_id=job.id,
        state=state_word,
        reason=reason if state_word == "PENDING" or reason in (SUBMISSION_LOST, NOT_REPORTED) else None,
        elapsed_s=elapsed,
        session=_is_session(job),
        estimated_start=job.expected_start_at if job.state == "PENDING" else None,
        queue_position=queue_position,
        array=_array_view(job),
        gpu_usage=usage,
    ).model_dump(mode="json", exclude_none=False)


def _is_session(job: Job) -> bool:
    template = app_state().templates.get(job.template)
    return template is not None and template.session is not None


