"""Job resources: submit, list, show, cancel, logs."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
import os
import re
from typing import Any

from flask import Blueprint, Response, jsonify, request, url_for
from pydantic import ValidationError
from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from api.context import db_session, principal, state
from api.metrics import JOBS_SUBMITTED
from api.schemas import IDEMPOTENCY_KEY_PATTERN, JOB_STATES, JobOut, SubmitRequest
from api.submission import submit
from gpupool.db import utcnow
from gpupool.errors import (
    BadRequest,
    CommandFailed,
    Conflict,
    NotFound,
    UnknownFields,
    UnsupportedMediaType,
    ValidationFailed,
)
from gpupool.models import Job
from gpupool.models.jobs import SUBMITTING
from gpupool.render import log_path
from gpupool.templates import validation_error_list

log = logging.getLogger("gpupool.jobs")
submit_bp = Blueprint("submit", __name__)
jobs_bp = Blueprint("jobs", __name__)

LIST_STATES = frozenset(JOB_STATES)
MAX_PAGE = 200
MAX_LOG_LINES = 10_000
_LOG_CHUNK = 64 * 1024


def job_view(job: Job, now: dt.datetime | None = None) -> dict[str, Any]:
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
        reason=reason if state_word == "PENDING" or reason == "SubmissionLost" else None,
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
    ).model_dump(mode="json")


def _json_body() -> dict[str, Any]:
    if not request.is_json:
        raise UnsupportedMediaType("send the body as JSON with Content-Type: application/json")
    body = request.get_json(silent=True)
    if body is None:
        raise BadRequest("the body is not valid JSON")
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _idempotency_key() -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key):
        raise BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters or spaces")
    return key


@submit_bp.post("/submit")
def submit_job() -> tuple[Response, int, dict[str, str]]:
    body = _json_body()
    unknown = set(body) - set(SubmitRequest.model_fields)
    if unknown:
        raise UnknownFields(unknown, SubmitRequest.model_fields)
    try:
        req = SubmitRequest.model_validate(body)
    except ValidationError as exc:
        errors = validation_error_list(exc)
        raise ValidationFailed(
            "invalid request: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors), errors=errors
        ) from exc
    job, replayed = submit(state(), db_session(), principal(), req, body, _idempotency_key())
    headers = {"Location": url_for("jobs.get_job", job_id=job.id)}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    else:
        JOBS_SUBMITTED.labels(template=job.template).inc()
    return jsonify(job_view(job)), 201, headers


def _visible_job(job_id: str) -> Job:
    caller = principal()
    job = db_session().get(Job, job_id) if len(job_id) <= 36 else None
    if job is None or (not caller.is_admin and job.account != caller.account):
        raise NotFound(f"no job {job_id!r} in your account")
    return job


def _refresh_states(session: Session) -> bool:
    """Run the shared refresh if it is due; True when states may have changed.

    The request's read transaction ends first: no transaction stays open while
    Slurm answers, and the refresher's own commit is then visible to re-reads.
    """
    refresher = state().refresher
    if not refresher.due():
        return False
    session.commit()
    return refresher.maybe_refresh()


def _refresh_if_unfinished(job: Job) -> None:
    session = db_session()
    if not job.finished and _refresh_states(session):
        session.refresh(job)


@jobs_bp.get("/jobs/<job_id>")
def get_job(job_id: str) -> Response:
    job = _visible_job(job_id)
    _refresh_if_unfinished(job)
    return jsonify(job_view(job))


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


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise BadRequest(f"{name} must be an integer") from exc
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}")
    return value


@jobs_bp.get("/jobs")
def list_jobs() -> Response:
    caller = principal()
    session = db_session()
    limit = _int_arg("limit", 50, 1, MAX_PAGE)
    query = select(Job)
    account = request.args.get("account")
    if not caller.is_admin:
        if account not in (None, caller.account):
            raise NotFound(f"no account {account!r} visible to you")
        account = caller.account
    if account:
        query = query.where(Job.account == account)
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
    if cursor:
        created, job_id = _decode_cursor(cursor)
        query = query.where(or_(Job.created_at < created, and_(Job.created_at == created, Job.id < job_id)))
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


@jobs_bp.delete("/jobs/<job_id>")
def cancel_job(job_id: str) -> tuple[Response, int]:
    job = _visible_job(job_id)
    _refresh_if_unfinished(job)
    if job.finished:
        raise Conflict(f"job {job.id} has already ended ({job.state})", code="job_finished")
    if job.slurm_job_id is None:
        raise Conflict("the job is still being submitted; retry in a few seconds", code="job_submitting")
    log.info("job %s (Slurm %s) cancelled by %s", job.id, job.slurm_job_id, principal().sub)
    try:
        state().slurm.cancel(job.slurm_job_id)
    except CommandFailed as exc:
        if "Invalid job id" not in exc.stderr and "already completing or completed" not in exc.stderr:
            raise
    return jsonify(job_view(job)), 202


def _tail_lines(path: str, lines: int) -> bytes:
    """The last ``lines`` lines of a file, reading backwards in chunks (logs can be huge)."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        position = handle.tell()
        data = b""
        while position > 0 and data.count(b"\n") <= lines:
            step = min(_LOG_CHUNK, position)
            position -= step
            handle.seek(position)
            data = handle.read(step) + data
    parts = data.split(b"\n")
    trailing_newline = data.endswith(b"\n")
    if trailing_newline:
        parts = parts[:-1]
    tail = b"\n".join(parts[-lines:])
    return tail + (b"\n" if trailing_newline and tail else b"")


@jobs_bp.get("/jobs/<job_id>/logs")
def job_logs(job_id: str) -> Response:
    job = _visible_job(job_id)
    stream = request.args.get("stream", "stdout")
    if stream not in ("stdout", "stderr"):
        raise BadRequest("stream must be stdout or stderr")
    lines = _int_arg("tail", 100, 1, MAX_LOG_LINES)
    path = log_path(job.job_dir, stream)
    try:
        content = _tail_lines(path, lines)
    except FileNotFoundError:
        content = b""  # the job has not started writing yet
    return Response(content, status=200, mimetype="text/plain", content_type="text/plain; charset=utf-8")
