"""What every streamed download and paged folder listing shares: /files and /jobs/<id>/outputs.

A file arrives as a descriptor the run-as helper opened as its owner
(gpupool.storage); this module turns it into an answer (Range, ETag,
Last-Modified, 304, 416), sent by gunicorn with sendfile, and turns an agent's
page of a folder into the listing's JSON, with its cursor.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import os
import urllib.parse
from typing import Any, BinaryIO

from flask import Blueprint, Response, jsonify, request
from flask.blueprints import BlueprintSetupState
from werkzeug.http import http_date, is_resource_modified, parse_date, unquote_etag
from werkzeug.routing import PathConverter
from werkzeug.wsgi import FileWrapper

from api.errors import error_response
from api.routing import Reply
from api.schemas import ErrorOut, FileList
from gpupool.clock import utc_text
from gpupool.errors import BadRequest
from gpupool.storage.client import Answer
from gpupool.storage.paths import StoragePath

CHUNK_BYTES = 1024 * 1024
DEFAULT_PAGE = 1000
MAX_PAGE = 10000

LISTING_PARAMS = [
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE}},
    {"name": "cursor", "in": "query", "schema": {"type": "string"}, "description": "next_cursor of the page before"},
]
LISTING = Reply("A page of the folder's entries", FileList)
DOWNLOAD_HEADERS: dict[str, Any] = {
    "ETag": {"schema": {"type": "string"}},
    "Last-Modified": {"schema": {"type": "string"}},
    "Accept-Ranges": {"schema": {"const": "bytes"}},
}
BYTES = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
RANGE_HEADER = {"name": "Range", "in": "header", "schema": {"type": "string"}}


def download_replies(headers: dict[str, Any]) -> dict[str, Reply]:
    """The answers of a route that serves a file (with these headers) or a folder's listing."""
    return {
        "200": Reply("The file, or a folder's listing", FileList, content=BYTES, headers=headers),
        "206": Reply("The range asked for (Content-Range)", content=BYTES, headers=headers),
        "304": Reply("Not modified"),
        "416": Reply("No byte of the range is in the file (Content-Range: bytes */size)", ErrorOut),
    }


class _AnyPath(PathConverter):
    """Werkzeug's path, but also one that starts with '/': refused with a 400 that says why, not a 404 or 405.

    Never empty: a folder's own URL (`/files/`) is the listing's alone, so a PUT, POST or DELETE there is
    the 405 the document says, not a write to the top of the storage.
    """

    # Written so that werkzeug's matcher sees a "/" in it and lets it span names, as its own path does.
    regex = "[^/]?.+?"


def add_path_converter(blueprint: Blueprint) -> None:
    """``<storage_path:...>`` in ``blueprint``'s routes; call it before the blueprint's first route."""

    @blueprint.record_once
    def _add_converter(state: BlueprintSetupState) -> None:
        # Before the routes are added: a blueprint runs its deferred steps in order.
        state.app.url_map.converters.setdefault("storage_path", _AnyPath)


def modified(mtime_ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(mtime_ns // 1_000_000_000, dt.UTC)


def etag(facts: dict[str, Any]) -> str:
    return f"{facts['mtime_ns']:x}-{facts['size']:x}-{facts['ino']:x}"


def cursor_name(cursor: str | None) -> str | None:
    if cursor is None:
        return None
    try:
        return base64.urlsafe_b64decode(cursor.encode("ascii") + b"=" * (-len(cursor) % 4)).decode("utf-8")
    except (ValueError, binascii.Error, UnicodeError):
        raise BadRequest("cursor is not one this API gave", code="cursor_invalid") from None


def _cursor(name: str | None) -> str | None:
    return None if name is None else base64.urlsafe_b64encode(name.encode("utf-8")).decode("ascii").rstrip("=")


def page_size() -> int:
    raw = request.args.get("limit", str(DEFAULT_PAGE))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_PAGE}")
    return int(raw)


def listing_document(path: StoragePath, facts: dict[str, Any]) -> dict[str, Any]:
    """A page of a folder as the API shows it (``/files``, ``/jobs/<id>/outputs``, the Files page)."""
    entries = [
        {"name": entry["name"], "type": entry["type"], "size": entry["size"], "modified": utc_text(modified(entry["mtime_ns"]))}
        for entry in facts["entries"]
    ]
    shown = "/".join(path.parts) + ("/" if path.parts else "")
    return {"path": shown, "entries": entries, "next_cursor": _cursor(facts.get("next_after")), "unlisted": facts.get("skipped", 0)}


def folder_page(path: StoragePath, answer: Answer) -> dict[str, Any] | None:
    """The agent's answer to a GET as a folder's listing document; None (its file closed) when it opened a file."""
    if answer.fd is not None:
        answer.close()
        return None
    return listing_document(path, answer.facts)


def listing(path: StoragePath, facts: dict[str, Any]) -> Response:
    return jsonify(listing_document(path, facts))


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


def disposition(name: str) -> str:
    # RFC 6266 with RFC 5987's filename*: any name, never a header's structure.
    ascii_name = "".join(char if char.isascii() and char.isprintable() and char not in '"\\;' else "_" for char in name)
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"


# A tenant's bytes, never a page of this origin: no type sniffing, no script, saved rather than shown.
TENANT_BYTES_HEADERS = {
    "Cache-Control": "private, no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
}


def _if_range_matches(tag: str, changed: dt.datetime) -> bool:
    header = request.headers.get("If-Range")
    if header is None:
        return True
    if header.startswith(('"', "W/")):
        value, weak = unquote_etag(header)
        return not weak and value == tag
    date = parse_date(header)
    return date is not None and date >= changed


def download(path: StoragePath, facts: dict[str, Any], fd: int) -> Response:
    """The open file ``fd`` (whose facts the agent gave) as the answer: whole, one range, 304 or 416; ``fd`` is taken."""
    size, tag, changed = facts["size"], etag(facts), modified(facts["mtime_ns"])
    headers = {
        "ETag": f'"{tag}"',
        "Last-Modified": http_date(changed),
        "Accept-Ranges": "bytes",
        "Content-Type": "application/octet-stream",
        "Content-Disposition": disposition(path.parts[-1]),
        **TENANT_BYTES_HEADERS,
    }
    if not is_resource_modified(request.environ, etag=tag, last_modified=changed):
        os.close(fd)
        return Response(status=304, headers={key: headers[key] for key in ("ETag", "Last-Modified", "Cache-Control")})
    start, length, status = 0, size, 200
    ranges = request.range
    if ranges is not None and ranges.units == "bytes" and len(ranges.ranges) == 1 and _if_range_matches(tag, changed):
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
