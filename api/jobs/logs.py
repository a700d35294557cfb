"""A job's or an array task's log: its tail, or its bytes from an offset for a follower."""

from __future__ import annotations

from flask import Response, request

from api.context import app_state, db_session
from api.jobs.lookup import (
    JOB_ID_PARAM,
    TASK_INDEX_PARAM,
    array_job,
    array_task,
    jobs_bp,
    refresh_if_unfinished,
    visible_job,
)
from api.jobs.views import job_view
from api.query import int_arg, int_param
from api.routing import Reply, operation
from gpupool import joblogs
from gpupool.config import Settings
from gpupool.errors import BadRequest, NotFound
from gpupool.members import WRITERS
from gpupool.models import Account, Job, JobTask
from gpupool.render import log_path

MAX_LOG_LINES = 10_000
# The largest integer every JSON client holds exactly; far past any log, and pread never overflows.
MAX_LOG_OFFSET = 2**53 - 1
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_LOGS_DESCRIPTION = (
    "Without offset: the last `tail` lines, at most log_read_max_bytes. With `offset`: the bytes from it, "
    "at most `limit`, answered at once with what is there (empty at or past the end). Follow a job by "
    "reading again from Gpupool-Next-Offset until Gpupool-Log-Complete is true. 409 log_unavailable: the "
    "job put a symbolic link, FIFO or another user's file where its log belongs, and it is not followed."
)
_LOG_LIMIT = int_param(
    "limit", 1, MAX_LOG_OFFSET,
    description=f"With offset: at most this many bytes; a larger limit reads the server's log_read_max_bytes "
    f"({Settings.log_read_max_bytes // 1024} KiB unless configured), which is also the default",
)
_LOG_HEADERS = {
    "Gpupool-Job-State": {"description": "The job's state, as GET /jobs/{job_id} shows it (PENDING, RUNNING, COMPLETED, ...)", "schema": {"type": "string"}},
    "Gpupool-Next-Offset": {"description": "Offset reads only: the offset to read from next", "schema": {"type": "integer", "minimum": 0}},
    "Gpupool-Log-Complete": {
        "description": "Offset reads only: true when the job has ended and the next offset is the log's size, so nothing more will come",
        "schema": {"enum": ["true", "false"]},
    },
}


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
        int_param("tail", 1, MAX_LOG_LINES, description="The last N lines (default 100); not with offset"),
        int_param(
            "offset", 0, MAX_LOG_OFFSET,
            description="Return the bytes from this offset (start at 0, then send Gpupool-Next-Offset back); not with tail",
        ),
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
    job = visible_job(job_id)
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
        TASK_INDEX_PARAM,
        {"name": "stream", "in": "query", "schema": {"enum": ["stdout", "stderr"]}},
        int_param("tail", 1, MAX_LOG_LINES),
        int_param("offset", 0, MAX_LOG_OFFSET),
        _LOG_LIMIT,
    ],
    replies={"200": Reply("Log bytes", content=_TEXT, headers=_LOG_HEADERS)},
    errors=(400, 404, 409),
)
def task_logs(job_id: str, index: str) -> Response:
    """One array task's log, read as a job's is (``?stream=``, ``?tail=``, ``?offset=``, ``?limit=``)."""
    job = array_job(job_id)
    return _log_response(job, array_task(job, index))


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
    refresh_if_unfinished(job)
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
