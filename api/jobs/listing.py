"""The caller's jobs, newest first: GET /jobs, paged by an opaque cursor."""

from __future__ import annotations

import base64
import binascii
import datetime as dt

from flask import Response, jsonify, request
from sqlalchemy import select, tuple_

from api.context import db_session, principal
from api.jobs.lookup import MAX_PAGE, jobs_bp, refresh_states
from api.jobs.views import job_view
from api.query import int_arg, int_param
from api.routing import Reply, operation
from api.schemas import JOB_STATES, JobList
from gpupool.db import utcnow
from gpupool.errors import BadRequest, NotFound
from gpupool.members import ALL_ROLES
from gpupool.models import Job
from gpupool.models.jobs import SUBMITTING

LIST_STATES = frozenset(JOB_STATES)


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
        int_param("limit", 1, MAX_PAGE),
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
    if unfinished_exists is not None and refresh_states(session):
        session.expire_all()
    if state_filter:  # applied after the refresh, so it sees current states
        query = query.where(Job.state.in_(wanted))
    rows = list(session.scalars(query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)))
    page, more = rows[:limit], len(rows) > limit
    now = utcnow()
    return jsonify(
        {"jobs": [job_view(job, now) for job in page], "next_cursor": _encode_cursor(page[-1]) if more else None}
    )


