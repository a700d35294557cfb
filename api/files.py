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
to and from it: sendfile under gunicorn for downloads, 1 MiB writes at the
upload's offset for uploads.

An upload is written to the path's upload in progress and renamed into place
when its body is complete, so a reader sees the old file or the whole new one.
A body cut off keeps what arrived: HEAD tells how much (Upload-Offset), and a
PUT with ``Upload-Offset: N`` and the rest of the bytes completes it. A write
past the quota is refused by the kernel; the upload's bytes are then removed
and the answer is 507 storage_quota_exceeded.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import errno
import os
import urllib.parse
from typing import Any, BinaryIO

from flask import Blueprint, Response, jsonify, request
from flask.blueprints import BlueprintSetupState
from werkzeug.http import http_date, is_resource_modified, parse_date, unquote_etag
from werkzeug.routing import PathConverter
from werkzeug.wsgi import FileWrapper

from api.context import app_state, principal
from api.errors import error_response
from api.routing import Reply, operation
from api.schemas import ErrorOut, FileList, FileOut
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


class _AnyPath(PathConverter):
    """Werkzeug's path, but also one that starts with '/': refused with a 400 that says why, not a 404 or 405.

    Never empty: `/files/` itself is the listing's alone, so a PUT, POST or DELETE there is the 405 the
    document says, not a write to the top of the storage.
    """

    # Written so that werkzeug's matcher sees a "/" in it and lets it span names, as its own path does.
    regex = "[^/]?.+?"


@files_bp.record_once
def _add_converter(state: BlueprintSetupState) -> None:
    # Before the routes below are added: a blueprint runs its deferred steps in order.
    state.app.url_map.converters.setdefault("storage_path", _AnyPath)

UPLOAD_OFFSET = "Upload-Offset"
CHUNK_BYTES = 1024 * 1024
DEFAULT_PAGE = 1000
MAX_PAGE = 10000

# The storage's share of the document (the roles of its members: they read and write it, viewers read).
_FILE_PATH = {
    "name": "path", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 4096},
    "description": "Relative to your storage, names joined by /; a trailing / names a folder. No '..', '.', empty "
    "names, NUL or control characters, no leading / (400 path_invalid); a name is at most 255 bytes of UTF-8",
}
_LISTING_PARAMS = [
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE}},
    {"name": "cursor", "in": "query", "schema": {"type": "string"}, "description": "next_cursor of the page before"},
]
_LISTING = Reply("A page of the folder's entries", FileList)
_DOWNLOAD_HEADERS = {
    "ETag": {"schema": {"type": "string"}},
    "Last-Modified": {"schema": {"type": "string"}},
    "Accept-Ranges": {"schema": {"const": "bytes"}},
    UPLOAD_OFFSET: {"description": "HEAD only: bytes an interrupted upload of this path holds (0: none), also on a 404", "schema": {"type": "integer"}},
}
_BYTES = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
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


def _modified(mtime_ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(mtime_ns // 1_000_000_000, dt.UTC)


def _etag(facts: dict[str, Any]) -> str:
    return f"{facts['mtime_ns']:x}-{facts['size']:x}-{facts['ino']:x}"


def _entry(path: StoragePath, facts: dict[str, Any]) -> dict[str, Any]:
    kind = facts["type"]
    return {
        "path": path.text,
        "type": kind,
        "size": facts["size"] if kind == "file" else None,
        "modified": utc_text(_modified(facts["mtime_ns"])),
        "etag": f'"{_etag(facts)}"' if kind == "file" else None,
    }


def _cursor_name(cursor: str | None) -> str | None:
    if cursor is None:
        return None
    try:
        return base64.urlsafe_b64decode(cursor.encode("ascii") + b"=" * (-len(cursor) % 4)).decode("utf-8")
    except (ValueError, binascii.Error, UnicodeError):
        raise BadRequest("cursor is not one this API gave", code="cursor_invalid") from None


def _cursor(name: str | None) -> str | None:
    return None if name is None else base64.urlsafe_b64encode(name.encode("utf-8")).decode("ascii").rstrip("=")


def _page_size() -> int:
    raw = request.args.get("limit", str(DEFAULT_PAGE))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_PAGE}")
    return int(raw)


def _listing_document(path: StoragePath, facts: dict[str, Any]) -> dict[str, Any]:
    entries = [
        {"name": entry["name"], "type": entry["type"], "size": entry["size"], "modified": utc_text(_modified(entry["mtime_ns"]))}
        for entry in facts["entries"]
    ]
    shown = "/".join(path.parts) + ("/" if path.parts else "")
    return {"path": shown, "entries": entries, "next_cursor": _cursor(facts.get("next_after")), "unlisted": facts.get("skipped", 0)}


def folder_listing(path: StoragePath, *, limit: int, cursor: str | None) -> dict[str, Any] | None:
    """A page of the caller's folder, as ``GET /files/<folder>/`` answers it; None when ``path`` names a file.

    For the Files page (api.web.files_page), which lists through the same storage calls as this API.
    """
    answer = _storage().get(_account(), path, limit=limit, after=_cursor_name(cursor))
    if answer.fd is not None:
        answer.close()
        return None
    return _listing_document(path, answer.facts)


def _listing(path: StoragePath, facts: dict[str, Any]) -> Response:
    return jsonify(_listing_document(path, facts))


class _FileRange:
    """``length`` bytes of an open file from ``start``: read() stops there, and fileno() lets gunicorn sendfile them."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        self._file: BinaryIO = os.fdopen(fd, "rb", buffering=0)
        self._file.seek(start)
        self._left = length

    def fileno(self) -> int:
        return self._file.fileno()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        data = self._file.read(size) if size > 0 else b""
        self._left -= len(data or b"")
        return data or b""

    def close(self) -> None:
        self._file.close()


def _disposition(name: str) -> str:
    # RFC 6266 with RFC 5987's filename*: any name, never a header's structure.
    ascii_name = "".join(char if char.isascii() and char.isprintable() and char not in '"\\;' else "_" for char in name)
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"


def _if_range_matches(etag: str, modified: dt.datetime) -> bool:
    header = request.headers.get("If-Range")
    if header is None:
        return True
    if header.startswith(('"', "W/")):
        value, weak = unquote_etag(header)
        return not weak and value == etag
    date = parse_date(header)
    return date is not None and date >= modified


def _download(path: StoragePath, facts: dict[str, Any], fd: int) -> Response:
    size, etag, modified = facts["size"], _etag(facts), _modified(facts["mtime_ns"])
    headers = {
        "ETag": f'"{etag}"',
        "Last-Modified": http_date(modified),
        "Accept-Ranges": "bytes",
        "Cache-Control": "private, no-cache",
        # A tenant's bytes, never a page of this origin: no type sniffing, no script, saved rather than shown.
        "Content-Type": "application/octet-stream",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "Content-Disposition": _disposition(path.parts[-1]),
    }
    if not is_resource_modified(request.environ, etag=etag, last_modified=modified):
        os.close(fd)
        return Response(status=304, headers={key: headers[key] for key in ("ETag", "Last-Modified", "Cache-Control")})
    start, length, status = 0, size, 200
    ranges = request.range
    if ranges is not None and ranges.units == "bytes" and len(ranges.ranges) == 1 and _if_range_matches(etag, modified):
        bounds = ranges.range_for_length(size)
        if bounds is None:
            os.close(fd)
            answer = error_response(416, "range_not_satisfiable", f"the file has {size} bytes; no byte of that range is in it")
            answer.headers["Content-Range"] = f"bytes */{size}"
            return answer
        start, stop = bounds
        length, status = stop - start, 206
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
    headers["Content-Length"] = str(length)
    wrapper = request.environ.get("wsgi.file_wrapper", FileWrapper)
    # gunicorn sends a file wrapper's file with sendfile(2), from its offset, Content-Length bytes.
    return Response(wrapper(_FileRange(fd, start, length), CHUNK_BYTES), status=status, headers=headers, direct_passthrough=True)


@operation(
    files_bp, "GET", "/files/", roles=ALL_ROLES, summary="The top of your storage: a page of its entries",
    parameters=_LISTING_PARAMS, replies={"200": _LISTING}, errors=(400, 404),
    defaults={"path": ""}, merge_slashes=False,
)
@operation(
    files_bp, "GET", "/files/<storage_path:path>", roles=ALL_ROLES,
    summary="Download a file (Range: one range, 206; If-None-Match, If-Modified-Since: 304), or list a folder",
    description="Served as it is stored, as an attachment (application/octet-stream). A symbolic link is never "
    "followed: 404, as for a missing name. HEAD answers the same headers and Upload-Offset.",
    parameters=[_FILE_PATH, *_LISTING_PARAMS, {"name": "Range", "in": "header", "schema": {"type": "string"}}],
    replies={
        "200": Reply("The file, or a folder's listing", FileList, content=_BYTES, headers=_DOWNLOAD_HEADERS),
        "206": Reply("The range asked for (Content-Range)", content=_BYTES, headers=_DOWNLOAD_HEADERS),
        "304": Reply("Not modified"),
        "416": Reply("No byte of the range is in the file (Content-Range: bytes */size)", ErrorOut),
    },
    errors=(400, 404, 409),
    merge_slashes=False,
)
def get_file(path: str) -> Response:
    storage, account = _storage(), _account()
    where = parse_path(path)
    head = request.method == "HEAD"
    try:
        answer = storage.get(account, where, limit=_page_size(), after=_cursor_name(request.args.get("cursor")), upload_offset=head)
    except NotFound as missing:
        if not head or "offset" not in missing.details:
            raise
        # No file yet, but maybe an upload of it that was cut off: how much it holds (0: none).
        response = error_response(404, missing.code, missing.message)
        response.headers[UPLOAD_OFFSET] = str(missing.details["offset"])
        return response
    if answer.fd is None:
        return _listing(where, answer.facts)
    response = _download(where, answer.facts, answer.take_fd())
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


def _receive(fd: int, start: int, length: int) -> int:
    """The body written at ``start``: the number of bytes received (fewer than ``length`` when it was cut off)."""
    stream = request.environ["wsgi.input"]
    position, left = start, length
    while left > 0:
        try:
            chunk = stream.read(min(CHUNK_BYTES, left))
        except Exception:  # noqa: BLE001 - gunicorn raises its own errors for a body cut off; all mean the same
            break
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            written = os.pwrite(fd, view, position)
            position += written
            view = view[written:]
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
    request_body={"content": _BYTES},
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
    response.headers["ETag"] = f'"{_etag(facts)}"'
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
