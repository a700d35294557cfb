"""What the blocking and the asyncio clients share: settings, retries, jobs, log chunks."""

from __future__ import annotations

import codecs
import os
import random
import re
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Generic, TypedDict, TypeVar

import httpx

from gpupool_client.errors import (
    ConnectionFailed,
    GpupoolError,
    RateLimited,
    ServiceUnavailable,
    error_from_response,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__version__ = "0.1.0"

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
        # gpupool's own: Slurm never reported the job for unknown_after_s; it has no end time.
        "UNKNOWN",
    }
)
# A submit can legitimately take the server's Slurm timeouts (~15 s) before it answers.
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
NEXT_OFFSET_HEADER = "Gpupool-Next-Offset"
LOG_COMPLETE_HEADER = "Gpupool-Log-Complete"
JOB_STATE_HEADER = "Gpupool-Job-State"
# /files: how many bytes an interrupted upload holds (HEAD), and where a PUT continues it.
UPLOAD_OFFSET_HEADER = "Upload-Offset"
TRANSFER_CHUNK = 1024 * 1024
# A transfer's progress: bytes done so far (of this file, resumed bytes included) and its size.
Progress = Callable[[int, int], None]


def resolve_settings(url: str | None, token: str | None) -> tuple[str, str | None]:
    url = url or os.environ.get("GPUPOOL_URL")
    token = token or os.environ.get("GPUPOOL_TOKEN")
    if not url:
        raise GpupoolError("no API address: pass url= or set GPUPOOL_URL (e.g. https://gpupool.example.com)")
    return url.rstrip("/"), token


def default_headers(token: str | None) -> dict[str, str]:
    headers = {"User-Agent": f"gpupool-client/{__version__}", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def new_idempotency_key() -> str:
    return f"gpupool-client-{uuid.uuid4()}"


@dataclass(frozen=True)
class RetryPolicy:
    """How often a request is retried on no answer, 429 or 503, always with the same body and key."""

    attempts: int = 6
    backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    # A Retry-After beyond this is not waited out silently: the caller gets the error.
    max_retry_after_s: float = 60.0

    def delay(self, attempt: int, error: GpupoolError | None) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or None to give up and raise."""
        if attempt + 1 >= self.attempts:
            return None
        backoff = min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.8, 1.2)
        if isinstance(error, (RateLimited, ServiceUnavailable)) and error.retry_after is not None:
            if error.retry_after > self.max_retry_after_s:
                return None
            return max(error.retry_after, 0.1)
        return backoff


def retryable(response: httpx.Response) -> bool:
    return response.status_code in (429, 503)


def answer_error(response: httpx.Response) -> GpupoolError:
    """The typed error for a non-2xx answer that has been read."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    return error_from_response(response.status_code, response.headers, body)


def raise_for_answer(response: httpx.Response) -> None:
    if not response.is_success:
        raise answer_error(response)


class JobArgs(TypedDict, total=False):
    """What a submit (or a quote) may ask besides the template; each left out takes the template's or server's default.

    ``array``: ``{"count": N, "max_parallel": K}`` (or just N) runs N tasks, at most K at
    once; ``sweep``: ``{"param": [v1, v2, ...]}`` runs one task per value.
    """

    gpus: int | None
    params: dict[str, Any] | None
    gpu_type: str | None
    name: str | None
    container_image: str | None
    cpus: int | None
    mem_gb: int | None
    time_limit_min: int | None
    idle_timeout_min: int | None
    array: dict[str, Any] | int | None
    sweep: dict[str, list[Any]] | None
    preemptible: bool
    requeue_on_failure: bool


# The fields sent as given when they are not None.
_OPTIONAL_FIELDS = ("gpus", "gpu_type", "name", "container_image", "cpus", "mem_gb", "time_limit_min", "idle_timeout_min")


def submit_body(template: str, **job: Unpack[JobArgs]) -> dict[str, Any]:
    params, array, sweep = job.get("params"), job.get("array"), job.get("sweep")
    body: dict[str, Any] = {"template": template, "params": dict(params or {})}
    if isinstance(array, dict):
        body["array"] = dict(array)
    elif array is not None:
        body["array"] = {"count": array}  # just N: N tasks, no throttle
    if sweep is not None:
        body["sweep"] = {name: list(values) for name, values in sweep.items()}
    if job.get("preemptible"):
        body["preemptible"] = True
    if job.get("requeue_on_failure"):
        body["requeue_on_failure"] = True
    body.update({key: job[key] for key in _OPTIONAL_FIELDS if job.get(key) is not None})  # type: ignore[literal-required]
    return body


def list_params(state: str | Iterable[str] | None, page_size: int, cursor: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": page_size}
    if state:
        params["state"] = state if isinstance(state, str) else ",".join(state)
    if cursor:
        params["cursor"] = cursor
    return params


def attachment_name(response: httpx.Response, fallback: str) -> str:
    match = re.search(r'filename="([^"/\\]+)"', response.headers.get("Content-Disposition", ""))
    return match.group(1) if match else fallback


def partial_path(path: Path) -> Path:
    return path.with_name(path.name + ".part")


V = TypeVar("V")
H = TypeVar("H", httpx.Client, httpx.AsyncClient)
TR = TypeVar("TR", httpx.BaseTransport, httpx.AsyncBaseTransport)


class Field(Generic[V]):
    """An attribute that reads the API's JSON field ``key`` (default: its own name) from the record's ``data``.

    With ``convert``, the field is always there and given as ``convert`` makes it; without, None when absent.
    """

    def __init__(self, key: str | None = None, *, convert: Callable[[Any], V] | None = None) -> None:
        self.key, self.convert = key, convert

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = self.key or name

    def __get__(self, record: Any, owner: type | None = None) -> V:
        if record is None:
            return self  # type: ignore[return-value]  # on the class: the descriptor, for help() and docs
        if self.convert is not None:
            return self.convert(record.data[self.key])
        return record.data.get(self.key)  # type: ignore[no-any-return]


class ClientCore(Generic[H, TR]):
    """What ``Client`` and ``AsyncClient`` are made of alike: the API's address, the token, the retry policy.

    ``url`` and ``token`` default to ``GPUPOOL_URL`` and ``GPUPOOL_TOKEN``; ``transport`` replaces httpx's own.
    """

    _http_class: type[H]

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        transport: TR | None = None,
    ) -> None:
        self.url, token = resolve_settings(url, token)
        self.retry = retry or RetryPolicy()
        # H and TR go in pairs (httpx.Client with a BaseTransport, the async ones together), which mypy cannot see.
        self._http: H = self._http_class(
            base_url=self.url, headers=default_headers(token), timeout=timeout, transport=transport  # type: ignore[arg-type]
        )


class JobFields:
    """A job as the API last described it (``data``, the full JSON object), and the client that asks again."""

    id: Field[str] = Field("job_id", convert=str)
    state: Field[str] = Field(convert=str)
    reason: Field[str | None] = Field()
    exit_code: Field[int | None] = Field()
    exit_signal: Field[int | None] = Field()
    elapsed_s: Field[int | None] = Field()
    slurm_job_id: Field[int | None] = Field()

    def __init__(self, client: Any, data: dict[str, Any], *, replayed: bool = False) -> None:
        self._client = client
        self.data = data
        self.replayed = replayed

    def _update(self, data: dict[str, Any]) -> None:
        self.data = data

    @property
    def done(self) -> bool:
        """Ended, with Slurm's final record in: the exit code and times no longer change."""
        if self.state == "UNKNOWN":
            return True
        return self.state in TERMINAL_STATES and self.data.get("ended_at") is not None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.state} exit_code={self.exit_code}>"


@dataclass(frozen=True)
class LogChunk:
    data: bytes
    next_offset: int
    complete: bool
    job_state: str | None


def log_chunk(response: httpx.Response, offset: int) -> LogChunk:
    raw_next = response.headers.get(NEXT_OFFSET_HEADER)
    if raw_next is None:
        raise GpupoolError(
            f"the server did not send {NEXT_OFFSET_HEADER}: it predates incremental logs; use logs(tail=...) instead"
        )
    return LogChunk(
        data=response.content,
        next_offset=int(raw_next) if raw_next.strip() else offset + len(response.content),
        complete=response.headers.get(LOG_COMPLETE_HEADER, "false").strip().lower() == "true",
        job_state=response.headers.get(JOB_STATE_HEADER),
    )


class LineAssembler:
    """Bytes in, whole decoded lines out (each with its newline); a line split across chunks is held back."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""

    def feed(self, data: bytes) -> Iterator[str]:
        self._pending += self._decoder.decode(data)
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            yield line + "\n"

    def finish(self) -> Iterator[str]:
        rest = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        if rest:
            yield rest


class FollowPacer:
    """Polling intervals for a log follower: quick while output flows, slower while the job is quiet."""

    def __init__(self, first_s: float = 0.25, max_s: float = 2.0) -> None:
        self._first_s = first_s
        self._max_s = max_s
        self._next_s = first_s

    def after(self, got_data: bool) -> float:
        if got_data:
            self._next_s = self._first_s
            return 0.0
        delay, self._next_s = self._next_s, min(self._max_s, self._next_s * 2)
        return delay


class WaitPacer:
    """Intervals between status polls: from ``first_s`` growing by half each time to ``max_s``."""

    def __init__(self, first_s: float, max_s: float) -> None:
        self._next_s = first_s
        self._max_s = max_s

    def next(self) -> float:
        delay, self._next_s = self._next_s, min(self._max_s, self._next_s * 1.5)
        return delay


SESSION_OPEN_STATES = ("ready", "idle")


def session_is_open(session: dict[str, Any]) -> bool:
    """True once a session can be opened; raises when it ended first (wait_session's one rule)."""
    if session["state"] in SESSION_OPEN_STATES:
        return True
    if session["state"] == "ended":
        reason = session.get("end_reason") or "see its job's state"
        raise GpupoolError(f"session {session['job_id']} ended before it was ready: {reason}", code="session_ended")
    return False


def files_path(remote: str) -> str:
    """``/files/<remote>``: a path in the account's storage, each name quoted, its slashes kept."""
    return "/files/" + urllib.parse.quote(remote, safe="/")


def outputs_path(job_id: str, remote: str = "") -> str:
    """``/jobs/<id>/outputs/<remote>``: a path in a job's output folder, each name quoted, its slashes kept."""
    return f"/jobs/{urllib.parse.quote(job_id, safe='')}/outputs/" + urllib.parse.quote(remote, safe="/")


def safe_name(name: str) -> str:
    """A name from a listing, refused if written to disk it could step out of its folder (the server never sends one)."""
    if name in ("", ".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise GpupoolError(f"the server listed a name that is not a plain name: {name!r}", code="name_refused")
    return name


def read_chunks(handle: BinaryIO, start: int, total: int, progress: Progress | None) -> Iterator[bytes]:
    """A local file's bytes from ``start`` to ``total``, a chunk at a time: an upload's body, never whole in memory."""
    handle.seek(start)
    done = start
    while done < total:
        chunk = handle.read(min(TRANSFER_CHUNK, total - done))
        if not chunk:
            raise GpupoolError(f"the local file shrank while it was being sent: {done} of {total} bytes", code="local_file_changed")
        done += len(chunk)
        yield chunk
        if progress is not None:
            progress(done, total)


def stored_offset(error: GpupoolError) -> int | None:
    """The bytes the server holds, from its 409 upload_offset_mismatch; None for any other error."""
    body = error.body if isinstance(error.body, dict) else {}
    offset = body.get("offset")
    return offset if error.code == "upload_offset_mismatch" and isinstance(offset, int) else None


def upload_offset_of(response: httpx.Response) -> int:
    raw = response.headers.get(UPLOAD_OFFSET_HEADER, "0").strip()
    return int(raw) if raw.isdigit() else 0


class Upload:
    """One resumable upload's state, shared by ``Client.upload`` and ``AsyncClient.upload``, which do the I/O.

    ``offset`` is where the next PUT starts: None starts over (no ``Upload-Offset``),
    a number continues what the server holds.
    """

    def __init__(self, remote: str, total: int, offset: int | None) -> None:
        self.path = files_path(remote)
        self.total = total
        self.offset = offset if offset is None or offset <= total else None  # not this file's beginning: start again

    def headers(self) -> dict[str, str]:
        headers = {"Content-Length": str(self.total - (self.offset or 0)), "Content-Type": "application/octet-stream"}
        if self.offset is not None:
            headers[UPLOAD_OFFSET_HEADER] = str(self.offset)
        return headers

    def body(self, handle: BinaryIO, progress: Progress | None) -> Iterator[bytes]:
        return read_chunks(handle, self.offset or 0, self.total, progress)

    def refused(self, response: httpx.Response, attempt: int, attempts: int) -> GpupoolError | None:
        """After a refused PUT: None to go on at once from where the server says it stands,
        else the error to retry after the policy's delay; raised here when no retry can help."""
        error = answer_error(response)
        kept = stored_offset(error)
        if kept is not None and kept <= self.total and attempt + 1 < attempts:
            self.offset = kept
            return None
        if error.code != "upload_in_progress" and not retryable(response):
            raise error
        return error

    def cut_off(self, exc: httpx.TransportError) -> GpupoolError:
        return ConnectionFailed(f"PUT {self.path}: {exc or type(exc).__name__}", code="connection_failed")


class Download:
    """One download written aside and renamed when whole, shared by ``Client.download`` and
    ``AsyncClient.download``, which do the I/O: what to ask next (``Range`` with ``If-Range``
    on the ETag, so a file replaced meanwhile starts over) and what an answer means for the file.
    """

    def __init__(
        self, remote: str, out: BinaryIO, target: Path, partial: Path, progress: Progress | None, *, path: str | None = None
    ) -> None:
        # ``path``: the URL path to ask, when it is not the account storage's (a job's outputs).
        self.remote, self.path = remote, path or files_path(remote)
        self.out, self.target, self.partial, self.progress = out, target, partial, progress
        self.etag: str | None = None
        self.total = 0

    def headers(self) -> dict[str, str]:
        done = self.out.tell()
        return {"Range": f"bytes={done}-", "If-Range": self.etag} if done and self.etag else {}

    def begin(self, response: httpx.Response) -> bool:
        """True when ``response`` brings the file's bytes (write them, then ``finish``); False for an error answer."""
        if response.status_code not in (200, 206):
            return False
        if response.headers.get("Content-Type", "").startswith("application/json"):
            raise GpupoolError(f"{self.remote} is a folder, not a file", code="is_a_folder")
        done = self.out.tell()
        if response.status_code == 200 or content_range_start(response) != done:
            self.out.seek(0)
            self.out.truncate()
            done = 0
        self.etag = response.headers.get("ETag")
        self.total = done + int(response.headers.get("Content-Length", "0"))
        return True

    def write(self, block: bytes) -> None:
        self.out.write(block)
        if self.progress is not None:
            self.progress(self.out.tell(), self.total)

    def finish(self) -> Path:
        """The file under its name once every byte has come; a cut-off answer is a ReadError, retried like any."""
        done = self.out.tell()
        if done != self.total:
            raise httpx.ReadError(f"the answer ended after {done} of {self.total} bytes")
        self.out.flush()
        self.partial.replace(self.target)
        return self.target

    def cut_off(self, exc: httpx.TransportError) -> GpupoolError:
        return ConnectionFailed(f"GET {self.path}: {exc or type(exc).__name__}", code="connection_failed")


def content_range_start(response: httpx.Response) -> int | None:
    """Where a 206's bytes start (``Content-Range: bytes START-END/SIZE``)."""
    match = re.match(r"bytes (\d+)-\d+/\d+", response.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None
