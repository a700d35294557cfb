"""The blocking client: ``Client`` and the ``Job`` objects it returns."""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from gpupool_client._core import (
    DEFAULT_TIMEOUT,
    TRANSFER_CHUNK,
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
    default_headers,
    files_path,
    list_params,
    log_chunk,
    new_idempotency_key,
    outputs_path,
    partial_path,
    raise_for_answer,
    resolve_settings,
    retryable,
    safe_name,
    session_is_open,
    submit_body,
    upload_offset_of,
)
from gpupool_client.errors import (
    ConnectionFailed,
    GpupoolError,
    RateLimited,
    ServiceUnavailable,
    WaitTimeout,
)


class Job(JobFields):
    """A job; methods ask the API again, attributes show what it said last."""

    def __init__(self, client: Client, data: dict[str, Any], *, replayed: bool = False) -> None:
        super().__init__(data, replayed=replayed)
        self._client = client

    def refresh(self) -> Job:
        self._update(self._client._get_job_data(self.id))
        return self

    def wait(self, timeout: float | None = None, *, poll_s: float = 1.0, max_poll_s: float = 10.0) -> Job:
        """Poll until the job has ended; returns this job with its final state and exit code.

        Rate limits and a briefly unavailable service are waited out (honouring
        Retry-After); ``WaitTimeout`` after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pacer = WaitPacer(poll_s, max_poll_s)
        while not self.done:
            delay = pacer.next()
            if deadline is not None and time.monotonic() + delay > deadline:
                raise WaitTimeout(f"job {self.id} still {self.state} after {timeout:g} s", code="wait_timeout")
            time.sleep(delay)
            try:
                self.refresh()
            except (RateLimited, ServiceUnavailable) as exc:
                time.sleep(exc.retry_after or 0)
            except ConnectionFailed:
                pass  # the next poll tries again; the deadline still applies
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

    def __init__(self, client: Client, job_id: str, data: dict[str, Any]) -> None:
        self._client = client
        self.job_id = job_id
        self.data = data

    @property
    def index(self) -> int:
        return int(self.data["index"])

    @property
    def state(self) -> str:
        return str(self.data["state"])

    @property
    def exit_code(self) -> int | None:
        return self.data.get("exit_code")

    @property
    def value(self) -> Any:
        """A sweep's value for this task."""
        return self.data.get("value")

    @property
    def gpu_seconds(self) -> int | None:
        return self.data.get("gpu_seconds")

    def refresh(self) -> Task:
        self.data = self._client._request("GET", f"/jobs/{self.job_id}/tasks/{self.index}").json()
        return self

    def cancel(self) -> Task:
        """Cancel this task alone; the array's other tasks go on."""
        self.data = self._client._request("DELETE", f"/jobs/{self.job_id}/tasks/{self.index}").json()
        return self

    def logs(self, stream: str = "stdout", *, tail: int | None = None) -> str:
        params: dict[str, Any] = {"stream": stream}
        if tail is not None:
            params["tail"] = tail
        return self._client._request("GET", f"/jobs/{self.job_id}/tasks/{self.index}/logs", params=params).text

    def __repr__(self) -> str:
        return f"Task({self.job_id!r}, {self.index}, state={self.state!r})"


class Client:
    """gpupool's API. ``url`` and ``token`` default to ``GPUPOOL_URL`` and ``GPUPOOL_TOKEN``."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url, token = resolve_settings(url, token)
        self.retry = retry or RetryPolicy()
        self._http = httpx.Client(base_url=self.url, headers=default_headers(token), timeout=timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send, retrying on no answer, 429 and 503 with the very same request (and so the same Idempotency-Key)."""
        attempt = 0
        while True:
            error: GpupoolError
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                error = ConnectionFailed(f"{method} {path}: {exc or type(exc).__name__}", code="connection_failed")
            else:
                if not retryable(response):
                    raise_for_answer(response)
                    return response
                error = answer_error(response)
            delay = self.retry.delay(attempt, error)
            if delay is None:
                raise error
            time.sleep(delay)
            attempt += 1

    def _get_job_data(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/jobs/{job_id}").json()

    def submit(
        self,
        template: str,
        *,
        gpus: int | None = None,
        params: dict[str, Any] | None = None,
        gpu_type: str | None = None,
        name: str | None = None,
        container_image: str | None = None,
        cpus: int | None = None,
        mem_gb: int | None = None,
        time_limit_min: int | None = None,
        idempotency_key: str | None = None,
        idle_timeout_min: int | None = None,
        array: dict[str, Any] | int | None = None,
        sweep: dict[str, list[Any]] | None = None,
        preemptible: bool = False,
    ) -> Job:
        """Submit a job. Retries never make a second job: each carries the same Idempotency-Key.

        ``array``: ``{"count": N, "max_parallel": K}`` (or just N) runs N tasks, at most K at
        once; ``sweep``: ``{"param": [v1, v2, ...]}`` runs one task per value. The job's
        ``tasks()`` lists them.
        """
        body = submit_body(
            template, gpus=gpus, params=params, gpu_type=gpu_type, name=name, container_image=container_image,
            cpus=cpus, mem_gb=mem_gb, time_limit_min=time_limit_min, idle_timeout_min=idle_timeout_min,
            array=array, sweep=sweep,
            preemptible=preemptible,
        )
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        response = self._request("POST", "/submit", json=body, headers=headers)
        return Job(self, response.json(), replayed=response.headers.get("Idempotent-Replayed") == "true")

    def quote(
        self,
        template: str,
        *,
        gpus: int | None = None,
        params: dict[str, Any] | None = None,
        gpu_type: str | None = None,
        name: str | None = None,
        container_image: str | None = None,
        cpus: int | None = None,
        mem_gb: int | None = None,
        time_limit_min: int | None = None,
        idle_timeout_min: int | None = None,
        array: dict[str, Any] | int | None = None,
        sweep: dict[str, list[Any]] | None = None,
        preemptible: bool = False,
    ) -> dict[str, Any]:
        """What ``submit`` with these arguments would cost at most and when Slurm would start it; submits nothing.

        Refused as the submit would be (PaymentRequired when the budget does not cover the worst case).
        """
        body = submit_body(
            template, gpus=gpus, params=params, gpu_type=gpu_type, name=name, container_image=container_image,
            cpus=cpus, mem_gb=mem_gb, time_limit_min=time_limit_min, idle_timeout_min=idle_timeout_min,
            array=array, sweep=sweep, preemptible=preemptible,
        )
        response = self._request("POST", "/submit", params={"dry_run": "true"}, json=body)
        result: dict[str, Any] = response.json()
        return result

    def job(self, job_id: str) -> Job:
        return Job(self, self._get_job_data(job_id))

    def map(
        self, template: str, param: str, values: Iterable[Any], *, max_parallel: int | None = None, **submit_args: Any
    ) -> list[Task]:
        """Run ``template`` once per value of ``param``, as one array job; returns its tasks (task i has value i)."""
        array = {"max_parallel": max_parallel} if max_parallel is not None else None
        return self.submit(template, sweep={param: list(values)}, array=array, **submit_args).tasks()

    def tasks(self, job_id: str, *, page_size: int = 200) -> list[Task]:
        """Every task of an array job, in index order."""
        tasks: list[Task] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size}
            if cursor:
                params["cursor"] = cursor
            page = self._request("GET", f"/jobs/{job_id}/tasks", params=params).json()
            tasks += [Task(self, job_id, data) for data in page["tasks"]]
            cursor = page.get("next_cursor")
            if not cursor:
                return tasks

    def session(self, job_id: str) -> dict[str, Any]:
        """A session job's state (starting, ready, idle, ended) and a fresh single-use ``link`` to open it."""
        return self._request("GET", f"/jobs/{job_id}/session").json()

    def wait_session(self, job_id: str, timeout: float | None = None, *, poll_s: float = 1.0, max_poll_s: float = 5.0) -> dict[str, Any]:
        """Poll until the session is ready (or idle) and return it with its link; GpupoolError if it ended first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            session = self.session(job_id)
            if session_is_open(session):
                return session
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"session {job_id} was not ready within {timeout:g} s", code="wait_timeout")
            time.sleep(poll_s)
            poll_s = min(max_poll_s, poll_s * 1.5)

    def start_session(self, template: str, *, timeout: float | None = None, **submit_args: Any) -> dict[str, Any]:
        """Submit a session template's job, wait until it is ready, and return the session with its link."""
        job = self.submit(template, **submit_args)
        return self.wait_session(job.id, timeout)

    def cancel(self, job_id: str) -> Job:
        return Job(self, self._request("DELETE", f"/jobs/{job_id}").json())

    def jobs(
        self, *, state: str | Iterable[str] | None = None, limit: int | None = None, page_size: int = 200
    ) -> Iterator[Job]:
        """Every job of the account, newest first, page after page; at most ``limit`` if given."""
        cursor: str | None = None
        yielded = 0
        while True:
            size = page_size if limit is None else max(1, min(page_size, limit - yielded))
            page = self._request("GET", "/jobs", params=list_params(state, size, cursor)).json()
            for data in page["jobs"]:
                if limit is not None and yielded >= limit:
                    return
                yielded += 1
                yield Job(self, data)
            cursor = page.get("next_cursor")
            if not cursor or (limit is not None and yielded >= limit):
                return

    def logs(self, job_id: str, *, stream: str = "stdout", tail: int | None = None) -> str:
        """The last ``tail`` lines (the server's default when None) of the job's output."""
        params: dict[str, Any] = {"stream": stream}
        if tail is not None:
            params["tail"] = tail
        return self._request("GET", f"/jobs/{job_id}/logs", params=params).text

    def follow(self, job_id: str, *, stream: str = "stdout", offset: int = 0) -> Iterator[str]:
        """Yield the output line by line as it is written, each line once; ends when the job has ended."""
        lines = LineAssembler()
        pacer = FollowPacer()
        while True:
            response = self._request("GET", f"/jobs/{job_id}/logs", params={"stream": stream, "offset": offset})
            chunk = log_chunk(response, offset)
            offset = chunk.next_offset
            yield from lines.feed(chunk.data)
            if chunk.complete:
                yield from lines.finish()
                return
            time.sleep(pacer.after(bool(chunk.data)))

    def templates(self) -> list[dict[str, Any]]:
        return self._request("GET", "/templates").json()["templates"]

    def usage(self, period: str | None = None) -> dict[str, Any]:
        """GPU-seconds, money and balance for a UTC month ``YYYY-MM`` (default: this month)."""
        return self._request("GET", "/usage", params={"period": period} if period else None).json()

    def invoice(self, period: str, path: str | os.PathLike[str] | None = None) -> Path:
        """Download the month's CSV invoice to ``path`` (default: the server's file name, here).

        The file appears whole or not at all: it is written aside and renamed.
        """
        attempt = 0
        partial: Path | None = None
        while True:
            error: GpupoolError
            try:
                with self._http.stream("GET", f"/invoices/{period}") as response:
                    if response.is_success:
                        target = Path(path) if path is not None else Path(attachment_name(response, f"invoice-{period}.csv"))
                        partial = partial_path(target)
                        with open(partial, "wb") as out:
                            for block in response.iter_bytes():
                                out.write(block)
                        partial.replace(target)
                        return target
                    response.read()
                    if not retryable(response):
                        raise_for_answer(response)
                    error = answer_error(response)
            except httpx.TransportError as exc:
                error = ConnectionFailed(f"GET /invoices/{period}: {exc or type(exc).__name__}", code="connection_failed")
                if partial is not None:
                    partial.unlink(missing_ok=True)  # cut off mid-body: never leave half an invoice
            delay = self.retry.delay(attempt, error)
            if delay is None:
                raise error
            time.sleep(delay)
            attempt += 1

    # -- the account's storage (/files) ----------------------------------------------------

    def upload_offset(self, remote: str) -> int:
        """How many bytes an interrupted upload of ``remote`` holds on the server (0: none)."""
        try:
            return upload_offset_of(self._http.head(files_path(remote)))
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"HEAD {files_path(remote)}: {exc or type(exc).__name__}", code="connection_failed") from exc

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
        source = Path(local)
        upload = Upload(remote, source.stat().st_size, self.upload_offset(remote) if resume else None)
        attempt = 0
        with open(source, "rb") as handle:
            while True:
                error: GpupoolError | None
                try:
                    response = self._http.put(upload.path, content=upload.body(handle, progress), headers=upload.headers())
                except httpx.TransportError as exc:
                    error = upload.cut_off(exc)
                else:
                    if response.is_success:
                        result: dict[str, Any] = response.json()
                        return result
                    error = upload.refused(response, attempt, self.retry.attempts)
                    if error is None:  # the server says where it stands: go on from there
                        attempt += 1
                        continue
                delay = self.retry.delay(attempt, error)
                if delay is None:
                    raise error
                time.sleep(delay)
                attempt += 1
                upload.offset = self.upload_offset(remote)

    def download(self, remote: str, local: str | os.PathLike[str], *, progress: Progress | None = None) -> Path:
        """Download ``remote`` from the account's storage to ``local``, streamed; the path written.

        The file appears whole or not at all: it is written aside and renamed.
        A dropped connection is resumed where it broke (Range, with If-Range on
        the file's ETag, so a file replaced meanwhile starts over).
        """
        return self._download(remote, local, progress, files_path(remote))

    def _download(self, remote: str, local: str | os.PathLike[str], progress: Progress | None, path: str) -> Path:
        target = Path(local)
        partial = partial_path(target)
        attempt = 0
        with open(partial, "wb") as out:
            download = Download(remote, out, target, partial, progress, path=path)
            try:
                while True:
                    error: GpupoolError
                    try:
                        with self._http.stream("GET", download.path, headers=download.headers()) as response:
                            if download.begin(response):
                                for block in response.iter_bytes(TRANSFER_CHUNK):
                                    download.write(block)
                                return download.finish()
                            response.read()
                            if not retryable(response):
                                raise_for_answer(response)
                            error = answer_error(response)
                    except httpx.TransportError as exc:
                        error = download.cut_off(exc)
                    delay = self.retry.delay(attempt, error)
                    if delay is None:
                        raise error
                    time.sleep(delay)
                    attempt += 1
            except BaseException:
                partial.unlink(missing_ok=True)  # never leave half a file behind
                raise

    def list_files(self, folder: str = "", *, page_size: int = 1000) -> list[dict[str, Any]]:
        """Every entry of a folder of the account's storage (``""``: its top), in name order."""
        return self._list(files_path(folder.rstrip("/") + "/" if folder.strip("/") else ""), page_size)

    def _list(self, path: str, page_size: int) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size}
            if cursor:
                params["cursor"] = cursor
            page = self._request("GET", path, params=params).json()
            entries += page["entries"]
            cursor = page.get("next_cursor")
            if not cursor:
                return entries

    def delete_file(self, remote: str, *, recursive: bool = False) -> None:
        """Delete a file, link or empty folder (``recursive``: any folder) of the account's storage."""
        self._request("DELETE", files_path(remote), params={"recursive": "true"} if recursive else None)

    def move_file(self, remote: str, target: str, *, overwrite: bool = False) -> dict[str, Any]:
        """Rename ``remote`` to ``target`` within the account's storage."""
        params = {"move_to": target, **({"overwrite": "true"} if overwrite else {})}
        result: dict[str, Any] = self._request("POST", files_path(remote), params=params).json()
        return result

    def list_outputs(self, job_id: str, folder: str = "", *, page_size: int = 1000) -> list[dict[str, Any]]:
        """Every entry of a folder of the job's outputs (``""``: the top of its output folder), in name order."""
        return self._list(outputs_path(job_id, folder.rstrip("/") + "/" if folder.strip("/") else ""), page_size)

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
        return self._download(remote, local, progress, outputs_path(job_id, remote))

    def outputs_tar(self, job_id: str, out: BinaryIO) -> int:
        """The job's whole output folder as one tar stream, written to ``out``; the bytes written.

        A cut-off archive is a ConnectionFailed, never a short file taken for a whole one.
        """
        written = 0
        try:
            with self._http.stream("GET", f"/jobs/{urllib.parse.quote(job_id, safe='')}/outputs.tar") as response:
                if not response.is_success:
                    response.read()
                    raise_for_answer(response)
                for block in response.iter_bytes(TRANSFER_CHUNK):
                    out.write(block)
                    written += len(block)
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"the archive of job {job_id}'s outputs was cut off: {exc}", code="connection_failed") from exc
        return written
