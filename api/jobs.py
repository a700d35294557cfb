"""Job resources: submit, list, show, cancel, logs."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
import re
from typing import Any

from flask import Blueprint, Response, jsonify, request, url_for
from sqlalchemy import and_, func, or_, select, tuple_
from sqlalchemy.orm import Session

from api.audit import audit
from api.context import app_state, db_session, principal
from api.metrics import JOBS_SUBMITTED
from api.query import int_arg
from api.routing import Reply, operation
from api.schemas import (
    IDEMPOTENCY_KEY_PATTERN,
    JOB_STATES,
    GpuSeriesOut,
    GpuUsageOut,
    JobList,
    JobOut,
    QuoteDetail,
    QuoteOut,
    SubmitOut,
    SubmitRequest,
    TaskCounts,
    TaskList,
    TaskOut,
    json_object,
    request_body,
)
from api.submission import Quote, quote, submit
from billing.money import format_nanos
from gpupool import joblogs
from gpupool.audit import JOB_CANCEL, TASK_CANCEL
from gpupool.config import Settings
from gpupool.db import utcnow
from gpupool.errors import (
    BadRequest,
    CommandFailed,
    Conflict,
    NotFound,
)
from gpupool.gpu_usage.idle import recent_usage
from gpupool.jobstate import NOT_REPORTED, SUBMISSION_LOST
from gpupool.members import ALL_ROLES, WRITERS
from gpupool.models import Account, Job, JobTask
from gpupool.models.jobs import SUBMITTING
from gpupool.render import log_path
from gpupool.webhooks.endpoints import job_callback_secret

log = logging.getLogger("gpupool.jobs")
submit_bp = Blueprint("submit", __name__)
jobs_bp = Blueprint("jobs", __name__)

LIST_STATES = frozenset(JOB_STATES)
MAX_PAGE = 200
# A task index to start a page from: past any array (max_array_tasks is at most 100,000).
MAX_TASK_CURSOR = 10**6
MAX_LOG_LINES = 10_000
# The largest integer every JSON client holds exactly; far past any log, and pread never overflows.
MAX_LOG_OFFSET = 2**53 - 1

JOB_ID_PARAM = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
_TASK_INDEX = {"name": "index", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}}
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_LOGS_DESCRIPTION = (
    "Without offset: the last `tail` lines, at most log_read_max_bytes. With `offset`: the bytes from it, "
    "at most `limit`, answered at once with what is there (empty at or past the end). Follow a job by "
    "reading again from Gpupool-Next-Offset until Gpupool-Log-Complete is true. 409 log_unavailable: the "
    "job put a symbolic link, FIFO or another user's file where its log belongs, and it is not followed."
)
_LOG_LIMIT = {
    "name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LOG_OFFSET},
    "description": f"With offset: at most this many bytes; a larger limit reads the server's log_read_max_bytes "
    f"({Settings.log_read_max_bytes // 1024} KiB unless configured), which is also the default",
}
_LOG_HEADERS = {
    "Gpupool-Job-State": {"description": "The job's state, as GET /jobs/{job_id} shows it (PENDING, RUNNING, COMPLETED, ...)", "schema": {"type": "string"}},
    "Gpupool-Next-Offset": {"description": "Offset reads only: the offset to read from next", "schema": {"type": "integer", "minimum": 0}},
    "Gpupool-Log-Complete": {
        "description": "Offset reads only: true when the job has ended and the next offset is the log's size, so nothing more will come",
        "schema": {"enum": ["true", "false"]},
    },
}


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
        job_id=job.id,
        name=job.name,
        account=job.account,
        template=job.template,
        params=job.params,
        state=state_word,
        reason=reason if state_word == "PENDING" or reason in (SUBMISSION_LOST, NOT_REPORTED) else None,
        slurm_job_id=job.slurm_job_id,
        gpus=job.gpus,
        gpu_type=job.gpu_type,
        cpus=job.cpus,
        mem_gb=job.mem_gb,
        time_limit_min=job.time_limit_min,
        container_image=job.container_image,
        node=job.node,
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        ended_at=job.ended_at,
        exit_code=job.exit_code,
        exit_signal=job.exit_signal,
        elapsed_s=elapsed,
        end_reason=job.end_reason,
        session=_is_session(job),
        estimated_start=job.expected_start_at if job.state == "PENDING" else None,
        queue_position=queue_position,
        array=_array_view(job),
        preemptible=job.preemptible,
        run_count=job.run_count,
        gpu_usage=usage,
    ).model_dump(mode="json", exclude_none=False)


def _is_session(job: Job) -> bool:
    template = app_state().templates.get(job.template)
    return template is not None and template.session is not None


def _idempotency_key() -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key):
        raise BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters or spaces")
    return key


def submit_request(body: dict[str, Any]) -> SubmitRequest:
    """``body`` as a typed submit request, or ValidationFailed naming each field: the API's and the form's rule."""
    return request_body(SubmitRequest, body, refuse_unknown=False)


def _dry_run_arg() -> bool:
    raw = request.args.get("dry_run")
    if raw is None or raw.lower() == "false":
        return False
    if raw.lower() == "true":
        return True
    raise BadRequest("dry_run must be true or false")


def quote_view(found: Quote) -> dict[str, Any]:
    cost = found.cost
    return QuoteOut(
        quote=QuoteDetail(
            gpus=found.gpus,
            gpu_type=found.gpu_type,
            time_limit_min=found.time_limit_min,
            gpu_seconds_worst_case=cost.gpu_seconds,
            price_per_gpu_second=None if cost.unit_price_nanos is None else format_nanos(cost.unit_price_nanos),
            worst_case_cost=None if cost.amount_nanos is None else format_nanos(cost.amount_nanos),
            currency=found.currency,
        ),
        estimated_start=found.estimated_start,
    ).model_dump(mode="json")


def _submit_body() -> tuple[dict[str, Any], SubmitRequest]:
    body = json_object()
    return body, request_body(SubmitRequest, body)


@operation(
    submit_bp, "POST", "/quote", roles=WRITERS,
    summary="A dry run of POST /submit: its checks, the worst-case cost and Slurm's start estimate; creates nothing",
    description="Refused as the submit would be (402 when the budget does not cover the worst case, 422...). "
    "The estimate is `sbatch --test-only` run as the account's tenant; null when Slurm gives none.",
    request=SubmitRequest, replies={"200": Reply("The quote", QuoteOut)}, errors=(400, 402, 403, 413, 415, 422),
)
def quote_job() -> tuple[Response, int]:
    """``POST /submit?dry_run=true`` under its own name."""
    _body, req = _submit_body()
    return jsonify(quote_view(quote(app_state(), db_session(), principal(), req))), 200


@operation(
    submit_bp, "POST", "/submit", roles=WRITERS,
    summary="Submit a job from a template",
    description="409 job_limit_reached: the account already has as many jobs pending or running as Slurm lets it "
    "hold (each array task counts as one); `limit`, `in_use` and `asked` say how many.",
    parameters=[
        {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN}},
        {
            "name": "dry_run", "in": "query", "required": False, "schema": {"enum": ["true", "false"]},
            "description": "true: the same checks and refusals, but nothing is created; answers 200 with the quote (as POST /quote)",
        },
    ],
    request=SubmitRequest,
    replies={
        "200": Reply("dry_run=true: what the job would cost at most, and when Slurm would start it", QuoteOut),
        "201": Reply(
            "Submitted (or, with a used Idempotency-Key and the same body, the job it made)", SubmitOut,
            headers={"Idempotent-Replayed": {"description": "true when this answer replays an earlier submit", "schema": {"enum": ["true"]}}},
        ),
    },
    errors=(400, 402, 403, 409, 413, 415, 422),
)
def submit_job() -> tuple[Response, int] | tuple[Response, int, dict[str, str]]:
    if _dry_run_arg():
        return quote_job()
    body, req = _submit_body()
    job, replayed = submit(app_state(), db_session(), principal(), req, body, _idempotency_key())
    headers = {"Location": url_for("jobs.get_job", job_id=job.id)}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    else:
        JOBS_SUBMITTED.labels(template=job.template).inc()
    view = job_view(job)
    if req.callback_url is not None:
        view["callback_secret"] = job_callback_secret(db_session(), job.id)
    return jsonify(view), 201, headers


def _visible_job(job_id: str) -> Job:
    caller = principal()
    job = db_session().get(Job, job_id) if len(job_id) <= 36 else None
    if job is None or (not caller.is_admin and job.account != caller.account):
        raise NotFound(f"no job {job_id!r} in your account")
    # A member's view of the account is their own jobs: another member's reads as absent, as another account's does.
    if not caller.sees_whole_account and job.owner != caller.sub:
        raise NotFound(f"no job {job_id!r} of yours in account {caller.account}")
    return job


def _refresh_states(session: Session) -> bool:
    """Run the shared refresh if it is due; True when states may have changed.

    The request's read transaction ends first: no transaction stays open while
    Slurm answers, and the refresher's own commit is then visible to re-reads.
    """
    refresher = app_state().refresher
    if not refresher.due():
        return False
    session.commit()
    return refresher.maybe_refresh()


def _refresh_if_unfinished(job: Job) -> None:
    session = db_session()
    if not job.finished and _refresh_states(session):
        session.refresh(job)


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
    job = _visible_job(job_id)
    _refresh_if_unfinished(job)
    return jsonify(job_view(job, queue_position=_queue_position(db_session(), job), usage=usage_view(job)))


def _encode_cursor(job: Job) -> str:
    return base64.urlsafe_b64encode(f"{job.created_at.isoformat()}|{job.id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[dt.datetime, str]:
    try:
        created, _, job_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        created_at = dt.datetime.fromisoformat(created)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise BadRequest("cursor is not one this API issued") from exc
    if created_at.tzinfo is None or not job_id:
        raise BadRequest("cursor is not one this API issued")
    return created_at, job_id


@operation(
    jobs_bp, "GET", "/jobs", roles=ALL_ROLES, summary="The caller's jobs, newest first",
    parameters=[
        {
            "name": "state", "in": "query", "style": "form", "explode": False,
            "schema": {"type": "array", "items": {"enum": list(JOB_STATES)}},
            "description": "Only jobs in these states (comma-separated, any case)",
        },
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}},
        {"name": "account", "in": "query", "schema": {"type": "string"}, "description": "Admin tokens only: one account's jobs (default: all)"},
        {
            "name": "cursor", "in": "query", "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]+={0,2}$"},
            "description": "next_cursor of the page before, as the API gave it (400 for any other)",
        },
    ],
    replies={"200": Reply("A page of jobs", JobList)}, errors=(400, 404),
)
def list_jobs() -> Response:
    caller = principal()
    session = db_session()
    limit = int_arg("limit", 50, 1, MAX_PAGE)
    query = select(Job)
    account = request.args.get("account")
    if not caller.is_admin:
        if account not in (None, caller.account):
            raise NotFound(f"no account {account!r} visible to you")
        account = caller.account
    if account:
        query = query.where(Job.account == account)
    if not caller.sees_whole_account:
        query = query.where(Job.owner == caller.sub)
    state_filter = request.args.get("state")
    if state_filter:
        wanted = {word.strip().upper() for word in state_filter.split(",") if word.strip()}
        unknown = wanted - LIST_STATES
        if unknown:
            raise BadRequest(
                f"unknown state(s) {', '.join(sorted(unknown))}; use {', '.join(sorted(LIST_STATES))}"
            )
        if "PENDING" in wanted:
            wanted.add(SUBMITTING)
    cursor = request.args.get("cursor")
    if cursor is not None:  # an empty one too: no page was ever given out as ""
        created, job_id = _decode_cursor(cursor)
        # A row comparison, which the indexes on (..., created_at, id) answer as a range.
        query = query.where(tuple_(Job.created_at, Job.id) < (created, job_id))
    unfinished_exists = session.scalars(query.where(Job.finished.is_(False)).limit(1)).first()
    if unfinished_exists is not None and _refresh_states(session):
        session.expire_all()
    if state_filter:  # applied after the refresh, so it sees current states
        query = query.where(Job.state.in_(wanted))
    rows = list(session.scalars(query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)))
    page, more = rows[:limit], len(rows) > limit
    now = utcnow()
    return jsonify(
        {"jobs": [job_view(job, now) for job in page], "next_cursor": _encode_cursor(page[-1]) if more else None}
    )


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
        node=task.node,
        started_at=task.started_at,
        ended_at=task.ended_at,
        exit_code=task.exit_code,
        exit_signal=task.exit_signal,
        elapsed_s=elapsed,
        gpu_seconds=None if elapsed is None else elapsed * job.gpus,
        value=values[task.task_index] if values is not None and task.task_index < len(values) else None,
        logs=url_for("jobs.task_logs", job_id=job.id, index=task.task_index),
    ).model_dump(mode="json")


def _array_job(job_id: str) -> Job:
    job = _visible_job(job_id)
    if job.array_size is None:
        raise NotFound(f"job {job.id} is not an array job; it has no tasks", code="not_an_array")
    return job


def _task(job: Job, index: str) -> JobTask:
    task = db_session().get(JobTask, (job.id, int(index))) if index.isdigit() and len(index) <= 6 else None
    if task is None:
        raise NotFound(f"job {job.id} has no task {index!r}; its tasks are 0 to {(job.array_size or 1) - 1}")
    return task


@operation(
    jobs_bp, "GET", "/jobs/<job_id>/tasks", roles=ALL_ROLES,
    summary="An array job's tasks in index order, each with its state, exit code, GPU-seconds and sweep value",
    parameters=[
        JOB_ID_PARAM,
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}},
        {"name": "cursor", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": MAX_TASK_CURSOR}, "description": "next_cursor of the page before"},
    ],
    replies={"200": Reply("A page of tasks", TaskList)}, errors=(400, 404),
)
def list_tasks(job_id: str) -> Response:
    """An array job's tasks in index order, paged: ``?limit=`` and ``?cursor=`` (the next index)."""
    job = _array_job(job_id)
    _refresh_if_unfinished(job)
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
    parameters=[JOB_ID_PARAM, _TASK_INDEX], replies={"200": Reply("The task", TaskOut)}, errors=(404,),
)
def get_task(job_id: str, index: str) -> Response:
    job = _array_job(job_id)
    _refresh_if_unfinished(job)
    return jsonify(_task_view(job, _task(job, index), utcnow()))


@operation(
    jobs_bp, "DELETE", "/jobs/<job_id>/tasks/<index>", roles=WRITERS,
    summary="Cancel one task of an array job; its other tasks go on (DELETE /jobs/{job_id} cancels them all)",
    parameters=[JOB_ID_PARAM, _TASK_INDEX], replies={"202": Reply("Cancel requested", TaskOut)}, errors=(404, 409),
)
def cancel_task(job_id: str, index: str) -> tuple[Response, int]:
    """Cancel one task of an array job; its other tasks go on."""
    job = _array_job(job_id)
    _refresh_if_unfinished(job)
    task = _task(job, index)
    if task.finished:
        raise Conflict(f"task {task.task_index} of job {job.id} has already ended ({task.state})", code="task_finished")
    if job.slurm_job_id is None:
        raise Conflict("the job is still being submitted; retry in a few seconds", code="job_submitting")
    log.info("task %s of job %s (Slurm %s) cancelled by %s", task.task_index, job.id, job.slurm_job_id, principal().sub)
    try:
        app_state().slurm.cancel(job.slurm_job_id, job.account, task=task.task_index, user=job.unix_user)
    except CommandFailed as exc:
        if "Invalid job id" not in exc.stderr and "already completing or completed" not in exc.stderr:
            raise
    audit(TASK_CANCEL, account=job.account, target=f"{job.id}/{task.task_index}")
    db_session().commit()
    return jsonify(_task_view(job, task, utcnow())), 202


@operation(
    jobs_bp, "DELETE", "/jobs/<job_id>", roles=WRITERS, summary="Cancel a job",
    parameters=[JOB_ID_PARAM], replies={"202": Reply("Cancel requested", JobOut)}, errors=(404, 409),
)
def cancel_job(job_id: str) -> tuple[Response, int]:
    job = _visible_job(job_id)
    _refresh_if_unfinished(job)
    if job.finished:
        raise Conflict(f"job {job.id} has already ended ({job.state})", code="job_finished")
    if job.slurm_job_id is None:
        raise Conflict("the job is still being submitted; retry in a few seconds", code="job_submitting")
    log.info("job %s (Slurm %s) cancelled by %s", job.id, job.slurm_job_id, principal().sub)
    try:
        # As the user the job runs as (an admin cancelling a member's job too): Slurm lets no other.
        app_state().slurm.cancel(job.slurm_job_id, job.account, user=job.unix_user)
    except CommandFailed as exc:
        if "Invalid job id" not in exc.stderr and "already completing or completed" not in exc.stderr:
            raise
    audit(JOB_CANCEL, account=job.account, target=job.id)
    db_session().commit()
    return jsonify(job_view(job)), 202


def owner_uid(job: Job) -> int | None:
    """The uid that must own the job's logs: its member's own user's, else the account's (None: none recorded)."""
    if job.unix_uid is not None:
        return job.unix_uid
    account = db_session().get(Account, job.account)
    return getattr(account, "unix_uid", None)


@operation(
    jobs_bp, "GET", "/jobs/<job_id>/logs",
    roles=WRITERS,  # logs hold what a job printed, which may be its owner's secrets: its owner and the account's admins
    summary="Tail of the job's output, or its bytes from an offset for a follower",
    description=_LOGS_DESCRIPTION,
    parameters=[
        JOB_ID_PARAM,
        {"name": "stream", "in": "query", "schema": {"enum": ["stdout", "stderr"]}},
        {"name": "tail", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LOG_LINES}, "description": "The last N lines (default 100); not with offset"},
        {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LOG_OFFSET}, "description": "Return the bytes from this offset (start at 0, then send Gpupool-Next-Offset back); not with tail"},
        _LOG_LIMIT,
    ],
    replies={"200": Reply("Log bytes (UTF-8 text, but an offset read may end inside a character)", content=_TEXT, headers=_LOG_HEADERS)},
    errors=(400, 404, 409),
)
def job_logs(job_id: str) -> Response:
    """The tail of a log (``?tail=``), or the bytes from ``?offset=`` for a follower.

    Offset reads answer at once with what is there, never waiting for more, so
    a follower costs a worker one bounded read per poll.
    """
    job = _visible_job(job_id)
    if job.array_size is not None:
        raise NotFound(
            f"job {job.id} is an array job: each task has its own logs, at /jobs/{job.id}/tasks/<index>/logs",
            code="array_job_logs",
        )
    return _log_response(job, None)


@operation(
    jobs_bp, "GET", "/jobs/<job_id>/tasks/<index>/logs", roles=WRITERS,
    summary="One array task's log, read as GET /jobs/{job_id}/logs reads a job's",
    description=_LOGS_DESCRIPTION,
    parameters=[
        JOB_ID_PARAM,
        _TASK_INDEX,
        {"name": "stream", "in": "query", "schema": {"enum": ["stdout", "stderr"]}},
        {"name": "tail", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LOG_LINES}},
        {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LOG_OFFSET}},
        _LOG_LIMIT,
    ],
    replies={"200": Reply("Log bytes", content=_TEXT, headers=_LOG_HEADERS)},
    errors=(400, 404, 409),
)
def task_logs(job_id: str, index: str) -> Response:
    """One array task's log, read as a job's is (``?stream=``, ``?tail=``, ``?offset=``, ``?limit=``)."""
    job = _array_job(job_id)
    return _log_response(job, _task(job, index))


def _log_response(job: Job, task: JobTask | None) -> Response:
    stream = request.args.get("stream", "stdout")
    if stream not in ("stdout", "stderr"):
        raise BadRequest("stream must be stdout or stderr")
    following = "offset" in request.args
    if following and "tail" in request.args:
        raise BadRequest("offset and tail cannot be combined: follow with offset, or look back with tail")
    if "limit" in request.args and not following:
        raise BadRequest("limit applies to offset reads only")
    max_bytes = app_state().settings.log_read_max_bytes
    offset = int_arg("offset", 0, 0, MAX_LOG_OFFSET)
    # A larger limit is read as the most one answer carries, as documented.
    limit = min(int_arg("limit", max_bytes, 1, MAX_LOG_OFFSET), max_bytes)
    lines = int_arg("tail", 100, 1, MAX_LOG_LINES)
    # State first: a job seen finished here has written its last byte, so an offset
    # that reaches the size read below is truly the end.
    _refresh_if_unfinished(job)
    finished = job.finished
    if task is not None:
        db_session().refresh(task)
        finished = task.finished
    log_owner = owner_uid(job)
    headers = {"Gpupool-Job-State": job_view(job)["state"] if task is None else task.state}
    path = log_path(job.job_dir, stream, None if task is None else task.task_index)
    handle = joblogs.open_log(path, owner_uid=log_owner)
    # No file yet: the job has not started writing, which reads as an empty log.
    content, next_offset, size = b"", offset, 0
    if handle is not None:
        with handle:
            if following:
                content, next_offset = joblogs.read_from(handle, offset, limit)
                size = joblogs.log_size(handle)
            else:
                content = joblogs.read_tail(handle, lines, max_bytes)
    if following:
        headers["Gpupool-Next-Offset"] = str(next_offset)
        headers["Gpupool-Log-Complete"] = "true" if finished and next_offset == size else "false"
    return Response(content, status=200, headers=headers, content_type="text/plain; charset=utf-8")
