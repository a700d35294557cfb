"""One job: GET /jobs/<job_id> (with its place in the queue and recent GPU usage) and DELETE (cancel)."""

from __future__ import annotations

from flask import Response, jsonify
from sqlalchemy import and_, func, or_, select, tuple_
from sqlalchemy.orm import Session

from api.audit import audit
from api.context import db_session
from api.jobs.lookup import JOB_ID_PARAM, jobs_bp, refresh_if_unfinished, scancel, visible_job
from api.jobs.views import job_view, usage_view
from api.routing import Reply, operation
from api.schemas import JobOut
from gpupool.audit import JOB_CANCEL
from gpupool.errors import Conflict
from gpupool.members import ALL_ROLES, WRITERS
from gpupool.models import Job


def _queue_position(session: Session, job: Job) -> int | None:
    """1 + gpupool's pending jobs of the job's GPU type that Slurm expects to start first; None unless pending.

    Computed on read, not stored: every job behind one that starts moves up, and
    writing each of their rows on each refresh would cost more than this count,
    which the (finished, state) index narrows to the pending jobs.
    """
    if job.state != "PENDING":
        return None
    ahead = select(func.count()).select_from(Job).where(
        Job.finished.is_(False), Job.state == "PENDING", Job.id != job.id,
        Job.gpu_type.is_(None) if job.gpu_type is None else Job.gpu_type == job.gpu_type,
    )
    earlier = tuple_(Job.created_at, Job.id) < (job.created_at, job.id)
    if job.expected_start_at is None:
        # Without an estimate, behind every job that has one, and behind those submitted before it.
        ahead = ahead.where(or_(Job.expected_start_at.is_not(None), earlier))
    else:
        ahead = ahead.where(
            or_(
                Job.expected_start_at < job.expected_start_at,
                and_(Job.expected_start_at == job.expected_start_at, earlier),
            )
        )
    return 1 + int(session.scalar(ahead) or 0)


@operation(
    jobs_bp, "GET", "/jobs/<job_id>", roles=ALL_ROLES, summary="One job",
    parameters=[JOB_ID_PARAM], replies={"200": Reply("The job", JobOut)}, errors=(404,),
)
def get_job(job_id: str) -> Response:
    job = visible_job(job_id)
    refresh_if_unfinished(job)
    return jsonify(job_view(job, queue_position=_queue_position(db_session(), job), usage=usage_view(job)))


@operation(
    jobs_bp, "DELETE", "/jobs/<job_id>", roles=WRITERS, summary="Cancel a job",
    parameters=[JOB_ID_PARAM], replies={"202": Reply("Cancel requested", JobOut)}, errors=(404, 409),
)
def cancel_job(job_id: str) -> tuple[Response, int]:
    job = visible_job(job_id)
    refresh_if_unfinished(job)
    if job.finished:
        raise Conflict(f"job {job.id} has already ended ({job.state})", code="job_finished")
    scancel(job, f"job {job.id}")
    audit(JOB_CANCEL, account=job.account, target=job.id)
    db_session().commit()
    return jsonify(job_view(job)), 202


