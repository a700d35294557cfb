"""The blocking client: ``Client`` and the ``Job`` objects it returns; each call is a flow of ``gpupool_client._flows``, carried out here."""

from __future__ import annotations

import os
import time
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import httpx

from gpupool_client import _flows
from gpupool_client._core import (
    TRANSFER_CHUNK,
    ClientCore,
    Field,
    JobFields,
    Progress,
    files_path,
    outputs_path,
    safe_name,
)
from gpupool_client._flows import Flow, Item, Pause, Send, Step, Stepper, T, call, exhaust

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpupool_client._core import JobArgs


class Job(JobFields):
    """A job; methods ask the API again, attributes show what it said last."""

    _client: Client

    def refresh(self) -> Job:
        self._update(self._client._json("GET", f"/jobs/{self.id}"))
        return self

    def wait(self, timeout: float | None = None, *, poll_s: float = 1.0, max_poll_s: float = 10.0) -> Job:
        """Poll until the job has ended; returns this job with its final state and exit code.

        Rate limits and a briefly unavailable service are waited out (honouring
        Retry-After); ``WaitTimeout`` after ``timeout`` seconds.
        """
        self._client._run(_flows.wait(self, self._client.retry, timeout, poll_s, max_poll_s))
        return self

    def cancel(self) -> Job:
        self._update(self._client.cancel(self.id).data)
        return self

    def logs(self, stream: str = "stdout", *, tail: int | None = None) -> str:
        return self._client.logs(self.id, stream=stream, tail=tail)

    def follow(self, stream: str = "stdout") -> Iterator[str]:
        return self._client.follow(self.id, stream=stream)

    @property
    def array(self) -> dict[str, Any] | None:
        """An array job's task count, throttle and tasks per state; None for a single job."""
        return self.data.get("array")

    def tasks(self) -> list[Task]:
        """An array job's tasks, in index order, as the API says they are now."""
        return self._client.tasks(self.id)


class Task:
    """One task of an array job; ``data`` is the API's JSON object for it."""

    index: Field[int] = Field(convert=int)
    state: Field[str] = Field(convert=str)
    exit_code: Field[int | None] = Field()
    value: Field[Any] = Field()  # a sweep's value for this task
    gpu_seconds: Field[int | None] = Field()

    def __init__(self, client: Client, job_id: str, data: dict[str, Any]) -> None:
        self._client = client
        self.job_id = job_id
        self.data = data

    def refresh(self) -> Task:
        self.data = self._client._json("GET", f"/jobs/{self.job_id}/tasks/{self.index}")
        return self

    def cancel(self) -> Task:
        """Cancel this task alone; the array's other tasks go on."""
        self.data = self._client._json("DELETE", f"/jobs/{self.job_id}/tasks/{self.index}")
        return self

    def logs(self, stream: str = "stdout", *, tail: int | None = None) -> str:
        return self._client._run(_flows.logs(f"/jobs/{self.job_id}/tasks/{self.index}/logs", stream, tail, self._client.retry))

    def __repr__(self) -> str:
        return f"Task({self.job_id!r}, {self.index}, state={self.state!r})"


class Client(ClientCore[httpx.Client, httpx.BaseTransport]):
    """gpupool's API. ``url`` and ``token`` default to ``GPUPOOL_URL`` and ``GPUPOOL_TOKEN``."""

    _http_class = httpx.Client

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _carry(self, step: Step) -> Any:
        """One step's I/O: its answer, or the error to throw into the flow."""
        try:
            if isinstance(step, Pause):
                return time.sleep(step.seconds)
            assert isinstance(step, Send)
            if step.sink is not None:
                with self._http.stream(**step.request()) as response:
                    if step.sink.begin(response):
                        for block in response.iter_bytes(TRANSFER_CHUNK):
                            step.sink.write(block)
                    else:
                        response.read()
                    return response
            return self._http.request(**step.request(), content=step.content)
        except BaseException as exc:  # the flow's own cleanup runs, and it raises on
            return exc

    def _iterate(self, flow: Flow[T]) -> Generator[Any, None, T]:
        """Carry out ``flow``, yielding its items; returns what it returns."""
        stepper = Stepper(flow)
        for step in stepper:
            if isinstance(step, Item):
                yield step.value
            else:
                stepper.answer = self._carry(step)
        return stepper.result  # type: ignore[no-any-return]

    def _run(self, flow: Flow[T]) -> T:
        return exhaust(self._iterate(flow))

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send, retrying on no answer, 429 and 503 with the very same request (and so the same Idempotency-Key)."""
        return self._run(call(Send(method, path, **kwargs), self.retry))

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._run(_flows.json_of(Send(method, path, **kwargs), self.retry))

    def submit(self, template: str, *, idempotency_key: str | None = None, **job: Unpack[JobArgs]) -> Job:
        """Submit a job (``JobArgs`` says what it may ask). Retries never make a second job: each carries the same Idempotency-Key.

        ``array``: ``{"count": N, "max_parallel": K}`` (or just N) runs N tasks, at most K at
        once; ``sweep``: ``{"param": [v1, v2, ...]}`` runs one task per value. The job's
        ``tasks()`` lists them.
        """
        data, replayed = self._run(_flows.submit(template, self.retry, idempotency_key, **job))
        return Job(self, data, replayed=replayed)

    def quote(self, template: str, **job: Unpack[JobArgs]) -> dict[str, Any]:
        """What ``submit`` with these arguments would cost at most and when Slurm would start it; submits nothing.

        Refused as the submit would be (PaymentRequired when the budget does not cover the worst case).
        """
        return self._run(_flows.quote(template, self.retry, **job))

    def job(self, job_id: str) -> Job:
        return Job(self, self._json("GET", f"/jobs/{job_id}"))

    def map(
        self, template: str, param: str, values: Iterable[Any], *, max_parallel: int | None = None, **submit_args: Any
    ) -> list[Task]:
        """Run ``template`` once per value of ``param``, as one array job; returns its tasks (task i has value i)."""
        array = {"max_parallel": max_parallel} if max_parallel is not None else None
        return self.submit(template, sweep={param: list(values)}, array=array, **submit_args).tasks()

    def tasks(self, job_id: str, *, page_size: int = 200) -> list[Task]:
        """Every task of an array job, in index order."""
        pages = _flows.every_page(f"/jobs/{job_id}/tasks", "tasks", page_size, self.retry)
        return [Task(self, job_id, data) for data in self._run(pages)]

    def session(self, job_id: str) -> dict[str, Any]:
        """A session job's state (starting, ready, idle, ended) and a fresh single-use ``link`` to open it."""
        return self._json("GET", f"/jobs/{job_id}/session")  # type: ignore[no-any-return]

    def wait_session(self, job_id: str, timeout: float | None = None, *, poll_s: float = 1.0, max_poll_s: float = 5.0) -> dict[str, Any]:
        """Poll until the session is ready (or idle) and return it with its link; GpupoolError if it ended first."""
        return self._run(_flows.wait_session(job_id, self.retry, timeout, poll_s, max_poll_s))

    def start_session(self, template: str, *, timeout: float | None = None, **submit_args: Any) -> dict[str, Any]:
        """Submit a session template's job, wait until it is ready, and return the session with its link."""
        job = self.submit(template, **submit_args)
        return self.wait_session(job.id, timeout)

    def cancel(self, job_id: str) -> Job:
        return Job(self, self._json("DELETE", f"/jobs/{job_id}"))

    def jobs(
        self, *, state: str | Iterable[str] | None = None, limit: int | None = None, page_size: int = 200
    ) -> Iterator[Job]:
        """Every job of the account, newest first, page after page; at most ``limit`` if given."""
        for data in self._iterate(_flows.jobs(state, limit, page_size, self.retry)):
            yield Job(self, data)

    def logs(self, job_id: str, *, stream: str = "stdout", tail: int | None = None) -> str:
        """The last ``tail`` lines (the server's default when None) of the job's output."""
        return self._run(_flows.logs(f"/jobs/{job_id}/logs", stream, tail, self.retry))

    def follow(self, job_id: str, *, stream: str = "stdout", offset: int = 0) -> Iterator[str]:
        """Yield the output line by line as it is written, each line once; ends when the job has ended."""
        return self._iterate(_flows.follow(job_id, stream, offset, self.retry))

    def templates(self) -> list[dict[str, Any]]:
        return self._json("GET", "/templates")["templates"]  # type: ignore[no-any-return]

    def usage(self, period: str | None = None) -> dict[str, Any]:
        """GPU-seconds, money and balance for a UTC month ``YYYY-MM`` (default: this month)."""
        return self._json("GET", "/usage", params={"period": period} if period else None)  # type: ignore[no-any-return]

    def invoice(self, period: str, path: str | os.PathLike[str] | None = None) -> Path:
        """Download the month's CSV invoice to ``path`` (default: the server's file name, here).

        The file appears whole or not at all: it is written aside and renamed.
        """
        return self._run(_flows.invoice(period, None if path is None else Path(path), self.retry))

    # -- the account's storage (/files) ----------------------------------------------------

    def upload_offset(self, remote: str) -> int:
        """How many bytes an interrupted upload of ``remote`` holds on the server (0: none)."""
        return self._run(_flows.upload_offset(remote))

    def upload(
        self, local: str | os.PathLike[str], remote: str, *, resume: bool = False, progress: Progress | None = None
    ) -> dict[str, Any]:
        """Upload a local file to ``remote`` in the account's storage, streamed; the API's description of the stored file.

        The file appears under its name only once it is whole. A dropped
        connection, a 429 or a 503 is retried (``retry``) from the bytes the
        server kept; ``resume=True`` also continues an upload that an earlier
        call or process left unfinished (the caller vouches it is this file).
        ``progress(done, total)`` is called after each chunk.
        """
        return self._run(_flows.upload(Path(local), remote, resume, progress, self.retry))

    def download(self, remote: str, local: str | os.PathLike[str], *, progress: Progress | None = None) -> Path:
        """Download ``remote`` from the account's storage to ``local``, streamed; the path written.

        The file appears whole or not at all: it is written aside and renamed.
        A dropped connection is resumed where it broke (Range, with If-Range on
        the file's ETag, so a file replaced meanwhile starts over).
        """
        return self._run(_flows.download(remote, Path(local), progress, self.retry))

    def list_files(self, folder: str = "", *, page_size: int = 1000) -> list[dict[str, Any]]:
        """Every entry of a folder of the account's storage (``""``: its top), in name order."""
        return self._run(_flows.list_files(folder, page_size, self.retry))

    def delete_file(self, remote: str, *, recursive: bool = False) -> None:
        """Delete a file, link or empty folder (``recursive``: any folder) of the account's storage."""
        self._request("DELETE", files_path(remote), params={"recursive": "true"} if recursive else None)

    def move_file(self, remote: str, target: str, *, overwrite: bool = False) -> dict[str, Any]:
        """Rename ``remote`` to ``target`` within the account's storage."""
        params = {"move_to": target, **({"overwrite": "true"} if overwrite else {})}
        return self._json("POST", files_path(remote), params=params)  # type: ignore[no-any-return]

    # -- a job's outputs ($GPUPOOL_JOB_DIR/output) --------------------------------------------

    def list_outputs(self, job_id: str, folder: str = "", *, page_size: int = 1000) -> list[dict[str, Any]]:
        """Every entry of a folder of the job's outputs (``""``: the top of its output folder), in name order."""
        return self._run(_flows.list_outputs(job_id, folder, page_size, self.retry))

    def output_files(self, job_id: str, folder: str = "") -> list[dict[str, Any]]:
        """Every entry under a folder of the job's outputs, folders walked, each with its ``path`` from the top."""
        found: list[dict[str, Any]] = []
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        for entry in self.list_outputs(job_id, prefix):
            path = prefix + safe_name(entry["name"])
            found.append({**entry, "path": path})
            if entry["type"] == "folder":
                found += self.output_files(job_id, path)
        return found

    def download_output(
        self, job_id: str, remote: str, local: str | os.PathLike[str], *, progress: Progress | None = None
    ) -> Path:
        """Download one file of the job's outputs to ``local``, as ``download`` does (whole or not at all, resumed)."""
        return self._run(_flows.download(remote, Path(local), progress, self.retry, path=outputs_path(job_id, remote)))

    def outputs_tar(self, job_id: str, out: BinaryIO) -> int:
        """The job's whole output folder as one tar stream, written to ``out``; the bytes written.

        A cut-off archive is a ConnectionFailed, never a short file taken for a whole one.
        """
        return self._run(_flows.outputs_tar(job_id, out))
