"""The blocking client: ``Client`` and the ``Job`` objects it returns."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from gpupool_client._core import (
    DEFAULT_TIMEOUT,
    FollowPacer,
    JobFields,
    LineAssembler,
    RetryPolicy,
    WaitPacer,
    answer_error,
    attachment_name,
    default_headers,
    list_params,
    log_chunk,
    new_idempotency_key,
    partial_path,
    raise_for_answer,
    resolve_settings,
    retryable,
    session_is_open,
    submit_body,
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
        preemptible: bool = False,
    ) -> Job:
        """Submit a job. Retries never make a second job: each carries the same Idempotency-Key."""
        body = submit_body(
            template, gpus=gpus, params=params, gpu_type=gpu_type, name=name, container_image=container_image,
            cpus=cpus, mem_gb=mem_gb, time_limit_min=time_limit_min, idle_timeout_min=idle_timeout_min,
            preemptible=preemptible,
        )
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        response = self._request("POST", "/submit", json=body, headers=headers)
        return Job(self, response.json(), replayed=response.headers.get("Idempotent-Replayed") == "true")

    def job(self, job_id: str) -> Job:
        return Job(self, self._get_job_data(job_id))

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
