"""The asyncio client: ``AsyncClient`` and ``AsyncJob``, the same methods as ``Client`` and ``Job``, awaited."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

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
    partial_path,
    raise_for_answer,
    resolve_settings,
    retryable,
    session_is_open,
    submit_body,
    upload_offset_of,
)
from gpupool_client.errors import ConnectionFailed, GpupoolError, RateLimited, ServiceUnavailable, WaitTimeout


class AsyncJob(JobFields):
    def __init__(self, client: AsyncClient, data: dict[str, Any], *, replayed: bool = False) -> None:
        super().__init__(data, replayed=replayed)
        self._client = client

    async def refresh(self) -> AsyncJob:
        self._update(await self._client._get_job_data(self.id))
        return self

    async def wait(self, timeout: float | None = None, *, poll_s: float = 1.0, max_poll_s: float = 10.0) -> AsyncJob:
        deadline = None if timeout is None else time.monotonic() + timeout
        pacer = WaitPacer(poll_s, max_poll_s)
        while not self.done:
            delay = pacer.next()
            if deadline is not None and time.monotonic() + delay > deadline:
                raise WaitTimeout(f"job {self.id} still {self.state} after {timeout:g} s", code="wait_timeout")
            await asyncio.sleep(delay)
            try:
                await self.refresh()
            except (RateLimited, ServiceUnavailable) as exc:
                await asyncio.sleep(exc.retry_after or 0)
            except ConnectionFailed:
                pass
        return self

    async def cancel(self) -> AsyncJob:
        self._update((await self._client.cancel(self.id)).data)
        return self

    async def logs(self, stream: str = "stdout", *, tail: int | None = None) -> str:
        return await self._client.logs(self.id, stream=stream, tail=tail)

    def follow(self, stream: str = "stdout") -> AsyncIterator[str]:
        return self._client.follow(self.id, stream=stream)


class AsyncClient:
    """Like ``Client``, for asyncio code: ``async with AsyncClient() as client: job = await client.submit(...)``."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url, token = resolve_settings(url, token)
        self.retry = retry or RetryPolicy()
        self._http = httpx.AsyncClient(base_url=self.url, headers=default_headers(token), timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        attempt = 0
        while True:
            error: GpupoolError
            try:
                response = await self._http.request(method, path, **kwargs)
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
            await asyncio.sleep(delay)
            attempt += 1

    async def _get_job_data(self, job_id: str) -> dict[str, Any]:
        return (await self._request("GET", f"/jobs/{job_id}")).json()

    async def submit(
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
    ) -> AsyncJob:
        """``Client.submit``, awaited; an array job's tasks: ``await client.tasks(job.id)``."""
        body = submit_body(
            template, gpus=gpus, params=params, gpu_type=gpu_type, name=name, container_image=container_image,
            cpus=cpus, mem_gb=mem_gb, time_limit_min=time_limit_min, idle_timeout_min=idle_timeout_min,
            array=array, sweep=sweep,
            preemptible=preemptible,
        )
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        response = await self._request("POST", "/submit", json=body, headers=headers)
        return AsyncJob(self, response.json(), replayed=response.headers.get("Idempotent-Replayed") == "true")

    async def quote(
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
        response = await self._request("POST", "/submit", params={"dry_run": "true"}, json=body)
        result: dict[str, Any] = response.json()
        return result

    async def job(self, job_id: str) -> AsyncJob:
        return AsyncJob(self, await self._get_job_data(job_id))

    async def tasks(self, job_id: str, *, page_size: int = 200) -> list[dict[str, Any]]:
        """Every task of an array job, in index order, as the API's JSON objects."""
        tasks: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size}
            if cursor:
                params["cursor"] = cursor
            page = (await self._request("GET", f"/jobs/{job_id}/tasks", params=params)).json()
            tasks += page["tasks"]
            cursor = page.get("next_cursor")
            if not cursor:
                return tasks

    async def session(self, job_id: str) -> dict[str, Any]:
        return (await self._request("GET", f"/jobs/{job_id}/session")).json()

    async def wait_session(
        self, job_id: str, timeout: float | None = None, *, poll_s: float = 1.0, max_poll_s: float = 5.0
    ) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            session = await self.session(job_id)
            if session_is_open(session):
                return session
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"session {job_id} was not ready within {timeout:g} s", code="wait_timeout")
            await asyncio.sleep(poll_s)
            poll_s = min(max_poll_s, poll_s * 1.5)

    async def start_session(self, template: str, *, timeout: float | None = None, **submit_args: Any) -> dict[str, Any]:
        job = await self.submit(template, **submit_args)
        return await self.wait_session(job.id, timeout)

    async def cancel(self, job_id: str) -> AsyncJob:
        return AsyncJob(self, (await self._request("DELETE", f"/jobs/{job_id}")).json())

    async def jobs(
        self, *, state: str | Iterable[str] | None = None, limit: int | None = None, page_size: int = 200
    ) -> AsyncIterator[AsyncJob]:
        cursor: str | None = None
        yielded = 0
        while True:
            size = page_size if limit is None else max(1, min(page_size, limit - yielded))
            page = (await self._request("GET", "/jobs", params=list_params(state, size, cursor))).json()
            for data in page["jobs"]:
                if limit is not None and yielded >= limit:
                    return
                yielded += 1
                yield AsyncJob(self, data)
            cursor = page.get("next_cursor")
            if not cursor or (limit is not None and yielded >= limit):
                return

    async def logs(self, job_id: str, *, stream: str = "stdout", tail: int | None = None) -> str:
        params: dict[str, Any] = {"stream": stream}
        if tail is not None:
            params["tail"] = tail
        return (await self._request("GET", f"/jobs/{job_id}/logs", params=params)).text

    async def follow(self, job_id: str, *, stream: str = "stdout", offset: int = 0) -> AsyncIterator[str]:
        lines = LineAssembler()
        pacer = FollowPacer()
        while True:
            response = await self._request("GET", f"/jobs/{job_id}/logs", params={"stream": stream, "offset": offset})
            chunk = log_chunk(response, offset)
            offset = chunk.next_offset
            for line in lines.feed(chunk.data):
                yield line
            if chunk.complete:
                for line in lines.finish():
                    yield line
                return
            await asyncio.sleep(pacer.after(bool(chunk.data)))

    async def templates(self) -> list[dict[str, Any]]:
        return (await self._request("GET", "/templates")).json()["templates"]

    async def usage(self, period: str | None = None) -> dict[str, Any]:
        return (await self._request("GET", "/usage", params={"period": period} if period else None)).json()

    async def invoice(self, period: str, path: str | os.PathLike[str] | None = None) -> Path:
        attempt = 0
        partial: Path | None = None
        while True:
            error: GpupoolError
            try:
                async with self._http.stream("GET", f"/invoices/{period}") as response:
                    if response.is_success:
                        target = Path(path) if path is not None else Path(attachment_name(response, f"invoice-{period}.csv"))
                        partial = partial_path(target)
                        # Local file writes are small and fast next to the network: not worth a thread.
                        with open(partial, "wb") as out:
                            async for block in response.aiter_bytes():
                                out.write(block)
                        partial.replace(target)
                        return target
                    await response.aread()
                    if not retryable(response):
                        raise_for_answer(response)
                    error = answer_error(response)
            except httpx.TransportError as exc:
                error = ConnectionFailed(f"GET /invoices/{period}: {exc or type(exc).__name__}", code="connection_failed")
                if partial is not None:
                    partial.unlink(missing_ok=True)
            delay = self.retry.delay(attempt, error)
            if delay is None:
                raise error
            await asyncio.sleep(delay)
            attempt += 1

    # -- the account's storage (/files): Client's methods, awaited ---------------------------

    async def upload_offset(self, remote: str) -> int:
        try:
            return upload_offset_of(await self._http.head(files_path(remote)))
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"HEAD {files_path(remote)}: {exc or type(exc).__name__}", code="connection_failed") from exc

    async def upload(
        self, local: str | os.PathLike[str], remote: str, *, resume: bool = False, progress: Progress | None = None
    ) -> dict[str, Any]:
        """As ``Client.upload``. Local reads are small and fast next to the network: not worth a thread."""
        source = Path(local)
        upload = Upload(remote, source.stat().st_size, await self.upload_offset(remote) if resume else None)
        attempt = 0
        with open(source, "rb") as handle:
            while True:
                error: GpupoolError | None
                try:
                    response = await self._http.put(upload.path, content=_each(upload.body(handle, progress)), headers=upload.headers())
                except httpx.TransportError as exc:
                    error = upload.cut_off(exc)
                else:
                    if response.is_success:
                        result: dict[str, Any] = response.json()
                        return result
                    error = upload.refused(response, attempt, self.retry.attempts)
                    if error is None:
                        attempt += 1
                        continue
                delay = self.retry.delay(attempt, error)
                if delay is None:
                    raise error
                await asyncio.sleep(delay)
                attempt += 1
                upload.offset = await self.upload_offset(remote)

    async def download(self, remote: str, local: str | os.PathLike[str], *, progress: Progress | None = None) -> Path:
        """As ``Client.download``."""
        target = Path(local)
        partial = partial_path(target)
        attempt = 0
        with open(partial, "wb") as out:
            download = Download(remote, out, target, partial, progress)
            try:
                while True:
                    error: GpupoolError
                    try:
                        async with self._http.stream("GET", download.path, headers=download.headers()) as response:
                            if download.begin(response):
                                async for block in response.aiter_bytes(TRANSFER_CHUNK):
                                    download.write(block)
                                return download.finish()
                            await response.aread()
                            if not retryable(response):
                                raise_for_answer(response)
                            error = answer_error(response)
                    except httpx.TransportError as exc:
                        error = download.cut_off(exc)
                    delay = self.retry.delay(attempt, error)
                    if delay is None:
                        raise error
                    await asyncio.sleep(delay)
                    attempt += 1
            except BaseException:
                partial.unlink(missing_ok=True)
                raise

    async def list_files(self, folder: str = "", *, page_size: int = 1000) -> list[dict[str, Any]]:
        path = files_path(folder.rstrip("/") + "/" if folder.strip("/") else "")
        entries: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size}
            if cursor:
                params["cursor"] = cursor
            page = (await self._request("GET", path, params=params)).json()
            entries += page["entries"]
            cursor = page.get("next_cursor")
            if not cursor:
                return entries

    async def delete_file(self, remote: str, *, recursive: bool = False) -> None:
        await self._request("DELETE", files_path(remote), params={"recursive": "true"} if recursive else None)

    async def move_file(self, remote: str, target: str, *, overwrite: bool = False) -> dict[str, Any]:
        params = {"move_to": target, **({"overwrite": "true"} if overwrite else {})}
        result: dict[str, Any] = (await self._request("POST", files_path(remote), params=params)).json()
        return result


async def _each(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
