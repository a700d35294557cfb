"""An array job's tasks: the page of them, one task, and cancelling one task alone."""

from __future__ import annotations

import datetime as dt
from typing import Any

from flask import Response, jsonify, url_for
from sqlalchemy import select

from api.audit import audit
from api.context import db_session
from api.jobs.lookup import (
    JOB_ID_PARAM,
    MAX_PAGE,
    TASK_INDEX_PARAM,
    array_job,
    array_task,
    jobs_bp,
    refresh_if_unfinished,
    scancel,
)
from api.query import int_arg, int_param
from api.routing import Reply, operation
from api.schemas import TaskList, TaskOut
from gpupool.audit import TASK_CANCEL
from gpupool.db import utcnow
from gpupool.errors import Conflict
from gpupool.members import ALL_ROLES, WRITERS
from gpupool.models import Job, JobTask
from gpupool.models.jobs import SUBMITTING

# A task index to start a page from: past any array (max_array_tasks is at most 100,000).
MAX_TASK_CURSOR = 10**6


def _task_view(job: Job, task: JobTask, now: dt.datetime) -> dict[str, Any]:
    elapsed = task.elapsed_s
    if elapsed is None and task.started_at is not None:
        elapsed = max(0, int(((task.ended_at or now) - task.started_at).total_seconds()))
    values = (job.sweep or {}).get("values")
    return TaskOut(
        index=task.task_index,
        slurm_job_id=f"{job.slurm_job_id}_{task.task_index}" if job.slurm_job_id is not None else "",
        state="PENDING" if job.state == SUBMITTING else task.state,
        reason=task.reason if task.state == "PENDING" else None,
        **{column: getattr(task, column) for column in ("node", "started_at", "ended_at", "exit_code", "exit_signal")},
        elapsed_s=elapsed,
        gpu_seconds=None if elapsed is None else elapsed * job.gpus,
        value=values[task.task_index] if values is not None and task.task_index < len(values) else None,
        logs=url_for("jobs.task_logs", job_id=job.id, index=task.task_index),
    ).model_dump(mode="json")


@operation(
    jobs_bp, "GET", "/jobs/<job_id>/tasks", roles=ALL_ROLES,
    summary="An array job's tasks in index order, each with its state, exit code, GPU-seconds and sweep value",
    parameters=[
        JOB_ID_PARAM,
        int_param("limit", 1, MAX_PAGE),
        int_param("cursor", 0, MAX_TASK_CURSOR, description="next_cursor of the page before"),
    ],
    replies={"200": Reply("A page of tasks", TaskList)}, errors=(400, 404),
)
def list_tasks(job_id: str) -> Response:
    """An array job's tasks in index order, paged: ``?limit=`` and ``?cursor=`` (the next index)."""
    job = array_job(job_id)
    refresh_if_unfinished(job)
    limit = int_arg("limit", 100, 1, MAX_PAGE)
    start = int_arg("cursor", 0, 0, MAX_TASK_CURSOR)
    session = db_session()
    rows = list(
        session.scalars(
            select(JobTask).where(JobTask.job_id == job.id, JobTask.task_index >= start)
            .order_by(JobTask.task_index).limit(limit + 1)
        )
    )
    page, more = rows[:limit], len(rows) > limit
    now = utcnow()
    return jsonify(
        {"tasks": [_task_view(job, task, now) for task in page], "next_cursor": str(rows[limit].task_index) if more else None}
    )


@operation(
    jobs_bp, "GET", "/jobs/<job_id>/tasks/<index>", roles=ALL_ROLES, summary="One task of an array job",
    parameters=[JOB_ID_PARAM, TASK_INDEX_PARAM], replies={"200": Reply("The task", TaskOut)}, errors=(404,),
)
def get_task(job_id: str, index: str) -> Response:
    job = array_job(job_id)
    refresh_if_unfinished(job)
    return jsonify(_task_view(job, array_task(job, index), utcnow()))


@operation(
    jobs_bp, "DELETE", "/jobs/<job_id>/tasks/<index>", roles=WRITERS,
    summary="Cancel one task of an array job; its other tasks go on (DELETE /jobs/{job_id} cancels them all)",
    parameters=[JOB_ID_PARAM, TASK_INDEX_PARAM], replies={"202": Reply("Cancel requested", TaskOut)}, errors=(404, 409),
)
def cancel_task(job_id: str, index: str) -> tuple[Response, int]:
    """Cancel one task of an array job; its other tasks go on."""
    job = array_job(job_id)
    refresh_if_unfinished(job)
    task = array_task(job, index)
    if task.finished:
        raise Conflict(f"task {task.task_index} of job {job.id} has already ended ({task.state})", code="task_finished")
    scancel(job, f"task {task.task_index} of job {job.id}", task.task_index)
    audit(TASK_CANCEL, account=job.account, target=f"{job.id}/{task.task_index}")
    db_session().commit()
    return jsonify(_task_view(job, task, utcnow())), 202


