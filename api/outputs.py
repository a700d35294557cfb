"""``/jobs/<id>/outputs``: what a job wrote to ``$GPUPOOL_OUTPUT_DIR`` (its folder's ``output``), listed, downloaded, or as one tar stream.

    GET  /jobs/<id>/outputs/            a page of the output folder's top (?format=tar: the whole folder as a tar)
    GET  /jobs/<id>/outputs/<path>      a file (Range, ETag, Last-Modified; HEAD too), or a page of a folder (path/)
    GET  /jobs/<id>/outputs.tar         the whole output folder, one tar stream

Files a job writes are its user's alone (the job's umask): the service cannot
read them. Each request goes to the run-as helper, which runs the storage
agent as the job folder's owner, checked to be a user of the job's account,
with the output folder as its root (gpupool.storage.broker): the kernel decides
what can be read, and a link is never followed. The tar is written by that
agent's child, as that user, into a pipe whose read end this module streams, so
the archive is never whole in memory or on disk; a link goes into it as a link.
The job must be one GET /jobs/<id> shows the caller, and of the caller's own
account: an operator's token reads no customer's outputs here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, request

from api.context import app_state, principal
from api.downloads import (
    CHUNK_BYTES,
    DOWNLOAD_HEADERS,
    LISTING_PARAMS,
    RANGE_HEADER,
    TENANT_BYTES_HEADERS,
    add_path_converter,
    cursor_name,
    disposition,
    download,
    download_replies,
    folder_page,
    listing,
    page_size,
)
from api.jobs.lookup import JOB_ID_PARAM, visible_job
from api.routing import Reply, operation
from api.schemas import FileList
from gpupool.errors import BadRequest, NotFound
from gpupool.members import WRITERS
from gpupool.models import Job
from gpupool.storage.client import StorageClient
from gpupool.storage.paths import StoragePath, parse_path
from gpupool.storage.tarstream import TarTail

outputs_bp = Blueprint("outputs", __name__)
add_path_converter(outputs_bp)

_OUTPUT_PATH = {
    "name": "path", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 4096},
    "description": "Relative to the job's output folder, names joined by /; a trailing / names a folder. No '..', '.', "
    "empty names, NUL or control characters, no leading / (400 path_invalid)",
}
_TAR = {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}
_FORMAT = {"name": "format", "in": "query", "schema": {"enum": ["json", "tar"]}, "description": "tar: the whole folder as GET outputs.tar sends it"}
_TAR_DESCRIPTION = (
    "Streamed as the job's user writes it (pax format): files, folders, and links as links, never followed; FIFOs "
    "and devices are left out. An archive that could not be finished ends the connection without its last chunk, "
    "so a client never takes a cut-off archive for a whole one."
)
# Outputs, like logs, may hold their job's owner's secrets: its owner and the account's admins (api.jobs' roles for logs).
_ROLES = WRITERS


def _job(job_id: str) -> Job:
    job = visible_job(job_id)
    if job.account != principal().account:
        raise NotFound(f"no job {job_id!r} in your account")
    return job


def _storage() -> StorageClient:
    return StorageClient(app_state().settings)


def output_listing(job_id: str, path: StoragePath, *, limit: int, cursor: str | None) -> dict[str, Any] | None:
    """A page of one of the job's output folders, as ``GET /jobs/<id>/outputs/<folder>/`` answers it; None when ``path`` names a file.

    For the job's page (api.web.job_outputs), which lists through this API's checks and storage calls.
    """
    job = _job(job_id)
    return folder_page(path, _storage().output_get(job.account, job.id, path, limit=limit, after=cursor_name(cursor)))


class _TarBody:
    """The pipe's bytes, a chunk at a time; a stream that did not end as a whole archive ends in an error, not quietly."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._tail = TarTail()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            chunk = os.read(self._fd, CHUNK_BYTES)
            if not chunk:
                break
            self._tail.feed(chunk)
            yield chunk
        if not self._tail.complete():
            # gunicorn then closes the connection without the closing chunk: the client sees a transfer cut off.
            raise OSError("the job's output archive ended before it was complete")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # a writer still at work then gets EPIPE and stops
            self._fd = -1


def _tar(job: Job) -> Response:
    fd = _storage().output_tar(job.account, job.id).take_fd()
    headers = {"Content-Disposition": disposition(f"{job.id}-outputs.tar"), **TENANT_BYTES_HEADERS}
    return Response(_TarBody(fd), status=200, headers=headers, content_type="application/x-tar", direct_passthrough=True)


@operation(
    outputs_bp, "GET", "/jobs/<job_id>/outputs.tar", roles=_ROLES,
    summary="The job's whole output folder, one streamed tar archive", description=_TAR_DESCRIPTION,
    parameters=[JOB_ID_PARAM], replies={"200": Reply("The archive", content=_TAR)}, errors=(404,),
)
def output_tar(job_id: str) -> Response:
    return _tar(_job(job_id))


@operation(
    outputs_bp, "GET", "/jobs/<job_id>/outputs/", roles=_ROLES,
    summary="The top of the job's output folder: a page of its entries (format=tar: the whole folder)",
    description="What the job wrote to $GPUPOOL_OUTPUT_DIR, read as the job's user. 404 no such job (or one "
    "of another account), or a job that made no output folder.",
    parameters=[JOB_ID_PARAM, *LISTING_PARAMS, _FORMAT],
    replies={"200": Reply("A page of the folder's entries, or the archive", FileList, content=_TAR)},
    errors=(400, 404), defaults={"path": ""}, merge_slashes=False,
)
@operation(
    outputs_bp, "GET", "/jobs/<job_id>/outputs/<storage_path:path>", roles=_ROLES,
    summary="Download one of the job's output files (Range: one range, 206; 304), or list one of its folders",
    description="Served as it is stored, as an attachment (application/octet-stream). A symbolic link is never "
    "followed: 404, as for a missing name. HEAD answers the same headers.",
    parameters=[JOB_ID_PARAM, _OUTPUT_PATH, *LISTING_PARAMS, RANGE_HEADER],
    replies=download_replies(DOWNLOAD_HEADERS),
    errors=(400, 404, 409), merge_slashes=False,
)
def get_output(job_id: str, path: str) -> Response:
    where = parse_path(path)
    kind = request.args.get("format", "json")
    if kind not in ("json", "tar") or (kind == "tar" and not where.is_root):
        raise BadRequest("format is json (a listing) or tar (the whole output folder, at /outputs/ only)")
    job = _job(job_id)
    if kind == "tar":
        return _tar(job)
    answer = _storage().output_get(job.account, job.id, where, limit=page_size(), after=cursor_name(request.args.get("cursor")))
    if answer.fd is None:
        return listing(where, answer.facts)
    return download(where, answer.facts, answer.take_fd())
