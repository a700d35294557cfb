"""What every job route shares: the jobs blueprint, the job a caller may see, and the shared state refresh."""

from __future__ import annotations

import logging

from flask import Blueprint
from sqlalchemy.orm import Session

from api.context import app_state, db_session, principal
from gpupool.errors import CommandFailed, Conflict, NotFound
from gpupool.models import Job, JobTask

log = logging.getLogger("gpupool.jobs")
jobs_bp = Blueprint("jobs", __name__)

MAX_PAGE = 200
JOB_ID_PARAM = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
TASK_INDEX_PARAM = {"name": "index", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}}


def visible_job(job_id: str) -> Job:
    caller = principal()
    job = db_session().get(Job, job_id) if len(job_id) <= 36 else None
    if job is None or (not caller.is_admin and job.account != caller.account):
        raise NotFound(f"no job {job_id!r} in your account")
    # A member's view of the account is their own jobs: another member's reads as absent, as another account's does.
    if not caller.sees_whole_account and job.owner != caller.sub:
        raise NotFound(f"no job {job_id!r} of yours in account {caller.account}")
    return job


def refresh_states(session: Session) -> bool:
    """Run the shared refresh if it is due; True when states may have changed.

    The request's read transaction ends first: no transaction stays open while
    Slurm answers, and the refresher's own commit is then visible to re-reads.
    """
    refresher = app_state().refresher
    if not refresher.due():
        return False
    session.commit()
    return refresher.maybe_refresh()


def refresh_if_unfinished(job: Job) -> None:
    session = db_session()
    if not job.finished and refresh_states(session):
        session.refresh(job)


def array_job(job_id: str) -> Job:
    job = visible_job(job_id)
    if job.array_size is None:
        raise NotFound(f"job {job.id} is not an array job; it has no tasks", code="not_an_array")
    return job


def array_task(job: Job, index: str) -> JobTask:
    task = db_session().get(JobTask, (job.id, int(index))) if index.isdigit() and len(index) <= 6 else None
    if task is None:
        raise NotFound(f"job {job.id} has no task {index!r}; its tasks are 0 to {(job.array_size or 1) - 1}")
    return task


def scancel(job: Job, what: str, task: int | None = None) -> None:
    """Ask Slurm to cancel ``job`` (or its task ``task``), as the user it runs as; one that has just ended is no error.

    ``what`` names it in the service's log ("job ...", "task 3 of job ...").
    """
    if job.slurm_job_id is None:
        raise Conflict("the job is still being submitted; retry in a few seconds", code="job_submitting")
    log.info("%s (Slurm %s) cancelled by %s", what, job.slurm_job_id, principal().sub)
    try:
        # As the user the job runs as (an admin cancelling a member's job too): Slurm lets no other.
        app_state().slurm.cancel(job.slurm_job_id, job.account, task=task, user=job.unix_user)
    except CommandFailed as exc:
        if "Invalid job id" not in exc.stderr and "already completing or completed" not in exc.stderr:
            raise
