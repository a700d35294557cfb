"""``/files``: the caller's account storage over HTTP, streamed both ways, never a whole file in memory.

    GET    /files/<path>            a file (Range, ETag, Last-Modified); a folder (or a path ending in /): a page of its listing
    HEAD   /files/<path>            the same headers, and Upload-Offset: the bytes an interrupted upload of the path holds
    PUT    /files/<path>            upload (Content-Length required); Upload-Offset: N continues one; a path ending in / makes a folder
    DELETE /files/<path>            a file, link or empty folder (recursive=true: any folder), and the path's upload in progress
    POST   /files/<path>?move_to=P  rename within the storage (overwrite=true replaces a file there)

Paths are the account's own, relative to its storage: another account's files
cannot be named at all, and a link is never followed (404, like a missing
name). Every open happens in the run-as helper as the account's Unix user
(gpupool.storage), which hands the descriptor over; this module only streams
to and from it: sendfile under gunicorn for downloads; for uploads, splice(2)
from gunicorn's socket to the file (1 MiB writes at the upload's offset
under any other server).

An upload is written to the path's upload in progress and renamed into place
when its body is complete, so a reader sees the old file or the whole new one.
A body cut off keeps what arrived: HEAD tells how much (Upload-Offset), and a
PUT with ``Upload-Offset: N`` and the rest of the bytes completes it. A write
past the quota is refused by the kernel; the upload's bytes are then removed
and the answer is 507 storage_quota_exceeded.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import socket
import ssl
from typing import Any

from flask import Blueprint, Response, jsonify, request

from api.context import app_state, principal
from api.downloads import (
    BYTES,
    CHUNK_BYTES,
    DOWNLOAD_HEADERS,
    LISTING,
    LISTING_PARAMS,
    RANGE_HEADER,
    add_path_converter,
    cursor_name,
    download,
    download_replies,
    etag,
    folder_page,
    listing,
    modified,
    page_size,
)
from api.errors import error_response
from api.routing import Reply, operation
from api.schemas import FileOut
from gpupool.clock import utc_text
from gpupool.errors import (
    BadRequest,
    Conflict,
    LengthRequired,
    NotFound,
    StorageQuotaExceeded,
    StorageUnavailable,
)
from gpupool.members import ALL_ROLES, WRITERS
from gpupool.storage.client import StorageClient
from gpupool.storage.paths import StoragePath, parse_path
from gpupool.storage.sizes import format_size
from gpupool.storage.volumes import volume_usage

files_bp = Blueprint("files", __name__)
add_path_converter(files_bp)

UPLOAD_OFFSET = "Upload-Offset"

# The storage's share of the document (the roles of its members: they read and write it, viewers read).
_FILE_PATH = {
    "name": "path", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 4096},
    "description": "Relative to your storage, names joined by /; a trailing / names a folder. No '..', '.', empty "
    "names, NUL or control characters, no leading / (400 path_invalid); a name is at most 255 bytes of UTF-8",
}
_DOWNLOAD_HEADERS = {
    **DOWNLOAD_HEADERS,
    UPLOAD_OFFSET: {"description": "HEAD only: bytes an interrupted upload of this path holds (0: none), also on a 404", "schema": {"type": "integer"}},
}
# The rest of a refused body is read and dropped up to this, so the client reads the answer instead
# of a reset; past it the connection is closed (a client then asks HEAD and /usage).
DRAIN_MAX_BYTES = 64 * 1024 * 1024


def _storage() -> StorageClient:
    settings = app_state().settings
    if not settings.storage_root:
        raise NotFound("this site has no account storage", code="storage_disabled")
    return StorageClient(settings)


def _account() -> str:
    # Always the caller's own: an operator's token acts on its own account here too, never on a customer's files.
    return principal().account


def _flag(name: str) -> bool:
    value = request.args.get(name, "false").lower()
    if value not in ("true", "false"):
        raise BadRequest(f"{name} must be true or false")
    return value == "true"


def _entry(path: StoragePath, facts: dict[str, Any]) -> dict[str, Any]:
    kind = facts["type"]
    return {
        "path": path.text,
        "type": kind,
        "size": facts["size"] if kind == "file" else None,
        "modified": utc_text(modified(facts["mtime_ns"])),
        "etag": f'"{etag(facts)}"' if kind == "file" else None,
    }


def folder_listing(path: StoragePath, *, limit: int, cursor: str | None) -> dict[str, Any] | None:
    """A page of the caller's folder, as ``GET /files/<folder>/`` answers it; None when ``path`` names a file.

    For the Files page (api.web.files_page), which lists through the same storage calls as this API.
    """
    return folder_page(path, _storage().get(_account(), path, limit=limit, after=cursor_name(cursor)))


@operation(
    files_bp, "GET", "/files/", roles=ALL_ROLES, summary="The top of your storage: a page of its entries",
    parameters=LISTING_PARAMS, replies={"200": LISTING}, errors=(400, 404),
    defaults={"path": ""}, merge_slashes=False,
)
@operation(
    files_bp, "GET", "/files/<storage_path:path>", roles=ALL_ROLES,
    summary="Download a file (Range: one range, 206; If-None-Match, If-Modified-Since: 304), or list a folder",
    description="Served as it is stored, as an attachment (application/octet-stream). A symbolic link is never "
    "followed: 404, as for a missing name. HEAD answers the same headers and Upload-Offset.",
    parameters=[_FILE_PATH, *LISTING_PARAMS, RANGE_HEADER],
    replies=download_replies(_DOWNLOAD_HEADERS),
    errors=(400, 404, 409),
    merge_slashes=False,
)
def get_file(path: str) -> Response:
    storage, account = _storage(), _account()
    where = parse_path(path)
    head = request.method == "HEAD"
    try:
        answer = storage.get(account, where, limit=page_size(), after=cursor_name(request.args.get("cursor")), upload_offset=head)
    except NotFound as missing:
        if not head or "offset" not in missing.details:
            raise
        # No file yet, but maybe an upload of it that was cut off: how much it holds (0: none).
        response = error_response(404, missing.code, missing.message)
        response.headers[UPLOAD_OFFSET] = str(missing.details["offset"])
        return response
    if answer.fd is None:
        return listing(where, answer.facts)
    response = download(where, answer.facts, answer.take_fd())
    if head and "upload_offset" in answer.facts:
        response.headers[UPLOAD_OFFSET] = str(answer.facts["upload_offset"])
    return response


def _drain(left: int) -> None:
    """Read and drop up to DRAIN_MAX_BYTES of the body, so that a refused client reads the answer."""
    stream = request.environ["wsgi.input"]
    left = min(left, DRAIN_MAX_BYTES)
    try:
        while left > 0:
            chunk = stream.read(min(CHUNK_BYTES, left))
            if not chunk:
                return
            left -= len(chunk)
    except Exception:  # noqa: BLE001 - the client went away: nothing to read for
        return


def _quota_refusal(account: str, message: str) -> StorageQuotaExceeded:
    refusal = StorageQuotaExceeded(message)
    usage = volume_usage(app_state().settings, account)
    if usage is not None:
        refusal.details.update(stored_bytes=usage.stored_bytes, available_bytes=usage.available_bytes)
    return refusal


def _gunicorn_body(length: int) -> tuple[socket.socket, Any] | None:
    """gunicorn's client socket and its reader of this body, when the body can be taken from the socket itself.

    That is: a plain blocking socket, a body of known length (gunicorn's LengthReader) of which nothing
    was read yet. Anything else (another server, a chunked body, TLS): None, and the body is read as WSGI says.
    """
    sock = request.environ.get("gunicorn.socket")
    body = request.environ.get("wsgi.input")
    reader = getattr(body, "reader", None)
    held = getattr(body, "buf", None)
    if (
        not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket) or sock.gettimeout() is not None
        or getattr(reader, "length", None) != length or not isinstance(held, io.BytesIO) or held.tell()
        or not hasattr(getattr(reader, "unreader", None), "take_buffered")
    ):
        return None
    return sock, reader


def _pwrite_all(fd: int, data: bytes, position: int) -> int:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        position += written
        view = view[written:]
    return position


def _splice_body(fd: int, start: int, length: int) -> int | None:
    """The body moved from gunicorn's socket to the file at ``start`` by the kernel (splice(2) through a pipe).

    gunicorn's reader copies every byte of a body several times through its Python buffers, which cost
    an upload three times the CPU of the rest of its way (bench/files). Here the bytes gunicorn read
    with the headers are taken from it, the rest never enters Python, and gunicorn's reader is told how
    much of the body is gone, so that what follows (a drain, a kept-alive connection's next request)
    starts where it should. None where gunicorn does not serve the body (_gunicorn_body).
    """
    found = _gunicorn_body(length)
    if found is None:
        return None
    sock, reader = found
    held = reader.unreader.take_buffered()
    if len(held) > length:
        reader.unreader.unread(held[length:])  # the start of a request pipelined behind this one
        held = held[:length]
    consumed = len(held)
    try:
        position = _pwrite_all(fd, held, start)
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            with contextlib.suppress(OSError):  # past the user's pipe allowance: the default 64 KiB
                fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, CHUNK_BYTES)
            while consumed < length:
                try:
                    moved = os.splice(sock.fileno(), write_end, length - consumed)
                except OSError:
                    moved = 0  # the client went away: a body cut off
                if not moved:
                    break
                consumed += moved
                while moved:
                    # Errors here are the file's (EDQUOT, ENOSPC): the caller's to answer.
                    written = os.splice(read_end, fd, moved, offset_dst=position)
                    if not written:
                        raise OSError(errno.EIO, "the file took no byte")
                    position += written
                    moved -= written
        finally:
            os.close(read_end)
            os.close(write_end)
    finally:
        reader.length -= consumed
    return position - start


def _receive(fd: int, start: int, length: int) -> int:
    """The body written at ``start``: the number of bytes received (fewer than ``length`` when it was cut off)."""
    spliced = _splice_body(fd, start, length)
    if spliced is not None:
        return spliced
    stream = request.environ["wsgi.input"]
    position, left = start, length
    while left > 0:
        try:
            chunk = stream.read(min(CHUNK_BYTES, left))
        except Exception:  # noqa: BLE001 - gunicorn raises its own errors for a body cut off; all mean the same
            break
        if not chunk:
            break
        position = _pwrite_all(fd, chunk, position)
        left -= len(chunk)
    return position - start


def _offset_header() -> int | None:
    raw = request.headers.get(UPLOAD_OFFSET)
    if raw is None:
        return None
    if not raw.strip().isdigit():
        raise BadRequest(f"{UPLOAD_OFFSET} is the number of bytes already stored, as HEAD tells it")
    return int(raw)


@operation(
    files_bp, "PUT", "/files/<storage_path:path>", roles=WRITERS,
    summary="Upload a file (streamed; whole or not at all under its name), or make a folder (path ending in /)",
    description=f"Content-Length is required (411). The body goes to the path's upload in progress and is renamed "
    f"into place once complete: a reader sees the old file or the whole new one. A body cut off keeps what arrived: "
    f"HEAD tells how much ({UPLOAD_OFFSET}); PUT the rest with {UPLOAD_OFFSET}: N to complete it (409 "
    f"upload_offset_mismatch, with `offset`, when N is not what is kept). One upload of a path at a time (409 "
    f"upload_in_progress). Past the quota: 507 storage_quota_exceeded, and the upload's bytes are removed.",
    parameters=[
        _FILE_PATH,
        {"name": UPLOAD_OFFSET, "in": "header", "schema": {"type": "integer", "minimum": 0},
         "description": "Continue an interrupted upload: the bytes it holds (HEAD); the body is the rest"},
    ],
    request_body={"content": BYTES},
    replies={"200": Reply("Replaced", FileOut), "201": Reply("Created", FileOut)},
    errors=(400, 403, 404, 409, 411, 507),
    merge_slashes=False,
)
def put_file(path: str) -> Response:
    storage, account = _storage(), _account()
    where = parse_path(path)
    if where.is_root:
        raise BadRequest("name a file (or a folder, ending in /) to create", code="path_invalid")
    if where.folder:
        facts = storage.mkdir(account, where)
        response = jsonify(_entry(where, facts))
        response.status_code = 201 if facts["created"] else 200
        return response
    length = request.content_length
    if length is None:
        raise LengthRequired("send Content-Length: an upload is stored whole, or resumed from Upload-Offset")
    offset = _offset_header()
    usage = volume_usage(app_state().settings, account)
    if usage is not None and length > usage.available_bytes:
        _drain(length)
        raise _quota_refusal(
            account, f"{format_size(length)} do not fit in your storage: {format_size(usage.available_bytes)} are free"
        )
    grant = storage.upload(account, where)
    fd = grant.take_fd()
    try:
        stored = int(grant.facts["upload_offset"])
        if offset is None:
            os.ftruncate(fd, 0)
            start = 0
        elif offset != stored:
            _drain(length)
            raise Conflict(
                f"the upload of {where.text} holds {stored} bytes, not {offset}: send the rest from {UPLOAD_OFFSET}: {stored}",
                code="upload_offset_mismatch", offset=stored,
            )
        else:
            start = offset
        try:
            received = _receive(fd, start, length)
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise StorageUnavailable(f"writing to your storage failed: {exc.strerror}") from exc
            # The kernel's answer: the quota is reached. The upload's bytes go, so they free what they took.
            os.ftruncate(fd, 0)
            storage.abort(account, where, int(grant.facts["ino"]))
            _drain(length)
            raise _quota_refusal(account, "your storage is full: its quota is reached; the upload was removed") from exc
        if received < length:
            raise BadRequest(
                f"the body ended after {received} of {length} bytes; {start + received} are kept: "
                f"send the rest with {UPLOAD_OFFSET}: {start + received}",
                code="upload_incomplete", offset=start + received,
            )
        info = os.fstat(fd)
        facts = storage.commit(account, where, info.st_ino, info.st_dev)
    finally:
        os.close(fd)  # after the commit: the upload's lock is held until its file has its name
    response = jsonify(_entry(where, facts))
    response.status_code = 201 if facts["created"] else 200
    response.headers["ETag"] = f'"{etag(facts)}"'
    return response


@operation(
    files_bp, "DELETE", "/files/<storage_path:path>", roles=WRITERS,
    summary="Delete a file, a link or an empty folder (recursive=true: any folder), and the path's upload in progress",
    parameters=[_FILE_PATH, {"name": "recursive", "in": "query", "schema": {"enum": ["true", "false"]}}],
    replies={"204": Reply("Deleted")}, errors=(400, 403, 404, 409),
    merge_slashes=False,
)
def delete_file(path: str) -> Response:
    storage, account = _storage(), _account()
    where = parse_path(path)
    if where.is_root:
        raise BadRequest("the top of your storage cannot be deleted", code="path_invalid")
    storage.delete(account, where, recursive=_flag("recursive"))
    return Response(status=204)


@operation(
    files_bp, "POST", "/files/<storage_path:path>", roles=WRITERS,
    summary="Move (rename) a file or folder within your storage",
    parameters=[
        _FILE_PATH,
        {"name": "move_to", "in": "query", "required": True, "schema": {"type": "string"}, "description": "The new path"},
        {"name": "overwrite", "in": "query", "schema": {"enum": ["true", "false"]}, "description": "Replace a file at move_to (409 already_exists otherwise)"},
    ],
    replies={"200": Reply("Moved", FileOut)}, errors=(400, 403, 404, 409),
    merge_slashes=False,
)
def move_file(path: str) -> Response:
    storage, account = _storage(), _account()
    where = parse_path(path)
    target_text = request.args.get("move_to")
    if target_text is None:
        raise BadRequest("POST /files/<path> moves it: give move_to=<new path>")
    target = parse_path(target_text)
    if where.is_root or target.is_root:
        raise BadRequest("the top of your storage cannot be moved, nor replaced", code="path_invalid")
    facts = storage.move(account, where, target, overwrite=_flag("overwrite"))
    return jsonify(_entry(StoragePath(target.parts, facts["type"] == "folder"), facts))
