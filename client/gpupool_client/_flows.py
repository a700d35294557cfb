"""Each API call written once, as a flow of steps that ``Client`` carries out blocking and ``AsyncClient`` awaited.

A flow is a generator. It yields what it needs done, a ``Send`` (one HTTP exchange, its
body streamed to a sink where it names one), a ``Pause`` or an ``Item`` (a value for the
caller's iterator), and is sent back the answer, or has the transport's
error thrown in. Retries, paging, polling and following live here, so the two clients
cannot drift apart; each only does the I/O (``Stepper`` moves a flow along for them).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TypeVar, Union

import httpx

from gpupool_client._core import (
    Download,
    FollowPacer,
    JobFields,
    LineAssembler,
    Progress,
    RetryPolicy,
    Upload,
    WaitPacer,
    answer_error,
    attachment_name,
    files_path,
    list_params,
    log_chunk,
    new_idempotency_key,
    outputs_path,
    partial_path,
    raise_for_answer,
    retryable,
    session_is_open,
    submit_body,
    upload_offset_of,
)
from gpupool_client.errors import ConnectionFailed, GpupoolError, RateLimited, ServiceUnavailable, WaitTimeout

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpupool_client._core import JobArgs

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    """One HTTP exchange; the answer is the ``httpx.Response``, whatever its status."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] | None = None
    content: Iterator[bytes] | None = field(default=None, compare=False)
    # Streamed: the body goes to the sink block by block when it wants it (Sink.begin), else is read whole.
    sink: Sink | None = field(default=None, compare=False)

    def request(self) -> dict[str, Any]:
        """httpx's keyword arguments for it (a body iterator aside: each client passes that its own way)."""
        return {"method": self.method, "url": self.path, "params": self.params, "json": self.json, "headers": self.headers}


class Sink(Protocol):
    def begin(self, response: httpx.Response) -> bool:
        """True when ``response`` brings the body wanted: its blocks then go to ``write``."""

    def write(self, block: bytes) -> None: ...


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Item:
    """A value for the caller: what an iterating method (``jobs``, ``follow``) yields."""

    value: Any


Step = Union[Send, Pause, Item]
Flow = Generator[Step, Any, T]


class Stepper:
    """Moves a flow along: each step in turn, after sending its answer (set ``answer``) in, or throwing an error in."""

    def __init__(self, flow: Flow[Any]) -> None:
        self._flow = flow
        self.answer: Any = None
        self.result: Any = None

    def __iter__(self) -> Iterator[Step]:
        while True:
            answer, self.answer = self.answer, None
            try:
                step = self._flow.throw(answer) if isinstance(answer, BaseException) else self._flow.send(answer)
            except StopIteration as done:
                self.result = done.value
                return
            yield step


def exhaust(steps: Generator[Any, None, T]) -> T:
    """A generator's return value, once it has run to its end."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def call(send: Send, retry: RetryPolicy) -> Flow[httpx.Response]:
    """``send`` until it is answered, retrying on no answer, 429 and 503 with the very same request
    (and so the same Idempotency-Key); the typed error for any other failure."""
    attempt = 0
    while True:
        error: GpupoolError
        try:
            response: httpx.Response = yield send
        except httpx.TransportError as exc:
            error = ConnectionFailed(f"{send.method} {send.path}: {exc or type(exc).__name__}", code="connection_failed")
        else:
            if not retryable(response):
                raise_for_answer(response)
                return response
            error = answer_error(response)
        yield from _after(error, attempt, retry)
        attempt += 1


def _after(error: GpupoolError, attempt: int, retry: RetryPolicy) -> Flow[None]:
    """The pause before the next attempt, or ``error`` raised when the policy gives up."""
    delay = retry.delay(attempt, error)
    if delay is None:
        raise error
    yield Pause(delay)


def json_of(send: Send, retry: RetryPolicy) -> Flow[Any]:
    return (yield from call(send, retry)).json()


# -- jobs -------------------------------------------------------------------------------


def submit(template: str, retry: RetryPolicy, idempotency_key: str | None, **job: Unpack[JobArgs]) -> Flow[tuple[dict[str, Any], bool]]:
    """The new job's JSON, and whether the answer replays an earlier submit with this key."""
    headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
    response = yield from call(Send("POST", "/submit", json=submit_body(template, **job), headers=headers), retry)
    return response.json(), response.headers.get("Idempotent-Replayed") == "true"


def quote(template: str, retry: RetryPolicy, **job: Unpack[JobArgs]) -> Flow[dict[str, Any]]:
    result: dict[str, Any] = yield from json_of(Send("POST", "/submit", params={"dry_run": "true"}, json=submit_body(template, **job)), retry)
    return result


def wait(job: JobFields, retry: RetryPolicy, timeout: float | None, poll_s: float, max_poll_s: float) -> Flow[None]:
    """Poll until the job has ended, updating ``job``; rate limits and a briefly unavailable service are waited out."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pacer = WaitPacer(poll_s, max_poll_s)
    while not job.done:
        delay = pacer.next()
        if deadline is not None and time.monotonic() + delay > deadline:
            raise WaitTimeout(f"job {job.id} still {job.state} after {timeout:g} s", code="wait_timeout")
        yield Pause(delay)
        try:
            job._update((yield from json_of(Send("GET", f"/jobs/{job.id}"), retry)))
        except (RateLimited, ServiceUnavailable) as exc:
            yield Pause(exc.retry_after or 0)
        except ConnectionFailed:
            pass  # the next poll tries again; the deadline still applies


def every_page(path: str, key: str, page_size: int, retry: RetryPolicy) -> Flow[list[Any]]:
    """Every entry under ``key`` of a paged listing, page after page (``limit``, ``cursor``)."""
    entries: list[Any] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": page_size, **({"cursor": cursor} if cursor else {})}
        page = yield from json_of(Send("GET", path, params=params), retry)
        entries += page[key]
        cursor = page.get("next_cursor")
        if not cursor:
            return entries


def jobs(state: str | Iterable[str] | None, limit: int | None, page_size: int, retry: RetryPolicy) -> Flow[None]:
    """Each job's JSON as an Item, newest first; at most ``limit`` if given."""
    cursor: str | None = None
    yielded = 0
    while True:
        size = page_size if limit is None else max(1, min(page_size, limit - yielded))
        page = yield from json_of(Send("GET", "/jobs", params=list_params(state, size, cursor)), retry)
        for data in page["jobs"]:
            if limit is not None and yielded >= limit:
                return
            yielded += 1
            yield Item(data)
        cursor = page.get("next_cursor")
        if not cursor or (limit is not None and yielded >= limit):
            return


def wait_session(job_id: str, retry: RetryPolicy, timeout: float | None, poll_s: float, max_poll_s: float) -> Flow[dict[str, Any]]:
    """Poll until the session is ready (or idle) and return it with its link; GpupoolError if it ended first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        session = yield from json_of(Send("GET", f"/jobs/{job_id}/session"), retry)
        if session_is_open(session):
            return session  # type: ignore[no-any-return]
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"session {job_id} was not ready within {timeout:g} s", code="wait_timeout")
        yield Pause(poll_s)
        poll_s = min(max_poll_s, poll_s * 1.5)


def logs(path: str, stream: str, tail: int | None, retry: RetryPolicy) -> Flow[str]:
    """The last ``tail`` lines (the server's default when None) of a job's or a task's output."""
    params: dict[str, Any] = {"stream": stream, **({"tail": tail} if tail is not None else {})}
    return (yield from call(Send("GET", path, params=params), retry)).text


def follow(job_id: str, stream: str, offset: int, retry: RetryPolicy) -> Flow[None]:
    """Each line of the output as an Item, as it is written, each once; ends when the job has ended."""
    lines = LineAssembler()
    pacer = FollowPacer()
    while True:
        response = yield from call(Send("GET", f"/jobs/{job_id}/logs", params={"stream": stream, "offset": offset}), retry)
        chunk = log_chunk(response, offset)
        offset = chunk.next_offset
        for line in lines.feed(chunk.data):
            yield Item(line)
        if chunk.complete:
            for line in lines.finish():
                yield Item(line)
            return
        yield Pause(pacer.after(bool(chunk.data)))


# -- files: the month's invoice, the account's storage -----------------------------------


class _Invoice:
    """The invoice's CSV, written aside and renamed when whole (a ``Sink``)."""

    def __init__(self, period: str, path: Path | None) -> None:
        self.period, self.path = period, path
        self.partial: Path | None = None
        self.out: BinaryIO | None = None

    def begin(self, response: httpx.Response) -> bool:
        if not response.is_success:
            return False
        self.target = self.path or Path(attachment_name(response, f"invoice-{self.period}.csv"))
        self.partial = partial_path(self.target)
        self.out = open(self.partial, "wb")  # noqa: SIM115  (closed by finish, or dropped by the flow)
        return True

    def write(self, block: bytes) -> None:
        assert self.out is not None
        self.out.write(block)

    def close(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None


def invoice(period: str, path: Path | None, retry: RetryPolicy) -> Flow[Path]:
    """Download the month's CSV invoice; the file appears whole or not at all."""
    attempt = 0
    while True:
        sink = _Invoice(period, path)
        error: GpupoolError
        try:
            response = yield Send("GET", f"/invoices/{period}", sink=sink)
            sink.close()
            if sink.partial is not None:
                sink.partial.replace(sink.target)
                return sink.target
            if not retryable(response):
                raise_for_answer(response)
            error = answer_error(response)
        except httpx.TransportError as exc:
            error = ConnectionFailed(f"GET /invoices/{period}: {exc or type(exc).__name__}", code="connection_failed")
            sink.close()
            if sink.partial is not None:
                sink.partial.unlink(missing_ok=True)  # cut off mid-body: never leave half an invoice
        yield from _after(error, attempt, retry)
        attempt += 1


def upload_offset(remote: str) -> Flow[int]:
    """How many bytes an interrupted upload of ``remote`` holds on the server (0: none)."""
    try:
        return upload_offset_of((yield Send("HEAD", files_path(remote))))
    except httpx.TransportError as exc:
        raise ConnectionFailed(f"HEAD {files_path(remote)}: {exc or type(exc).__name__}", code="connection_failed") from exc


def upload(source: Path, remote: str, resume: bool, progress: Progress | None, retry: RetryPolicy) -> Flow[dict[str, Any]]:
    """Upload a local file, streamed, resuming from the bytes the server kept; the API's description of the stored file."""
    upload = Upload(remote, source.stat().st_size, (yield from upload_offset(remote)) if resume else None)
    attempt = 0
    with open(source, "rb") as handle:
        while True:
            error: GpupoolError | None
            try:
                response = yield Send("PUT", upload.path, headers=upload.headers(), content=upload.body(handle, progress))
            except httpx.TransportError as exc:
                error = upload.cut_off(exc)
            else:
                if response.is_success:
                    return response.json()  # type: ignore[no-any-return]
                error = upload.refused(response, attempt, retry.attempts)
                if error is None:  # the server says where it stands: go on from there
                    attempt += 1
                    continue
            yield from _after(error, attempt, retry)
            attempt += 1
            upload.offset = yield from upload_offset(remote)


def download(remote: str, target: Path, progress: Progress | None, retry: RetryPolicy, *, path: str | None = None) -> Flow[Path]:
    """Download ``remote`` to ``target``, written aside and renamed when whole; a dropped connection resumes where it broke.

    ``path``: the URL path to ask, when it is not the account storage's (a job's outputs).
    """
    partial = partial_path(target)
    attempt = 0
    with open(partial, "wb") as out:
        download = Download(remote, out, target, partial, progress, path=path)
        try:
            while True:
                error: GpupoolError
                try:
                    response = yield Send("GET", download.path, headers=download.headers(), sink=download)
                    if response.status_code in (200, 206):  # what Download.begin took
                        return download.finish()
                    if not retryable(response):
                        raise_for_answer(response)
                    error = answer_error(response)
                except httpx.TransportError as exc:
                    error = download.cut_off(exc)
                yield from _after(error, attempt, retry)
                attempt += 1
        except BaseException:
            partial.unlink(missing_ok=True)  # never leave half a file behind
            raise


def folder_path(folder: str) -> str:
    """A folder's name as the API lists it: ending in /, or "" for the top."""
    return folder.rstrip("/") + "/" if folder.strip("/") else ""


def list_files(folder: str, page_size: int, retry: RetryPolicy) -> Flow[list[dict[str, Any]]]:
    return (yield from every_page(files_path(folder_path(folder)), "entries", page_size, retry))


def list_outputs(job_id: str, folder: str, page_size: int, retry: RetryPolicy) -> Flow[list[dict[str, Any]]]:
    return (yield from every_page(outputs_path(job_id, folder_path(folder)), "entries", page_size, retry))


class _Copy:
    """A body copied to ``out`` as it comes, counted (a ``Sink``)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.written = out, 0

    def begin(self, response: httpx.Response) -> bool:
        return response.is_success

    def write(self, block: bytes) -> None:
        self.out.write(block)
        self.written += len(block)


def outputs_tar(job_id: str, out: BinaryIO) -> Flow[int]:
    """The job's whole output folder as one tar stream, written to ``out``; the bytes written.

    Not retried: a cut-off archive is a ConnectionFailed, never a short file taken for a whole one.
    """
    copy = _Copy(out)
    try:
        response = yield Send("GET", f"/jobs/{urllib.parse.quote(job_id, safe='')}/outputs.tar", sink=copy)
    except httpx.TransportError as exc:
        raise ConnectionFailed(f"the archive of job {job_id}'s outputs was cut off: {exc}", code="connection_failed") from exc
    raise_for_answer(response)
    return copy.written
