"""The asyncio client: ``AsyncClient`` and ``AsyncJob``, the same methods as ``Client`` and ``Job``, awaited.

Each call is the same flow of ``gpupool_client._flows`` that ``Client`` runs; only the I/O here is awaited.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from gpupool_client import _flows
from gpupool_client._core import TRANSFER_CHUNK, ClientCore, JobFields, Progress, files_path
from gpupool_client._flows import Flow, Item, Pause, Send, Step, Stepper, T, call

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpupool_client._core import JobArgs


class AsyncJob(JobFields):
    """A job, as ``Job`` is, for ``AsyncClient``: its methods are awaited."""

    _client: AsyncClient

    async def refresh(self) -> AsyncJob:
        self._update(await self._client._json("GET", f"/jobs/{self.id}"))
        return self

    async def wait(self, timeout: float | None = None, *, poll_s: float = 1.0, max_poll_s: float = 10.0) -> AsyncJob:
        await self._client._run(_flows.wait(self, self._client.retry, timeout, poll_s, max_poll_s))
        return self

    async def cancel(self) -> AsyncJob:
        self._update((await self._client.cancel(self.id)).data)
        return self

    async def logs(self, stream: str = "stdout", *, tail: int | None = None) -> str:
        return await self._client.logs(self.id, stream=stream, tail=tail)

    def follow(self, stream: str = "stdout") -> AsyncIterator[str]:
        return self._client.follow(self.id, stream=stream)


class AsyncClient(ClientCore[httpx.AsyncClient, httpx.AsyncBaseTransport]):
    """Like ``Client``, for asyncio code: ``async with AsyncClient() as client: job = await client.submit(...)``."""

    _http_class = httpx.AsyncClient

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _carry(self, step: Step) -> Any:
        """One step's I/O, awaited: its answer, or the error to throw into the flow.

        Local file reads and writes are small and fast next to the network: not worth a thread.
        """
        try:
            if isinstance(step, Pause):
                return await asyncio.sleep(step.seconds)
            assert isinstance(step, Send)
            if step.sink is not None:
                async with self._http.stream(**step.request()) as response:
                    if step.sink.begin(response):
                        async for block in response.aiter_bytes(TRANSFER_CHUNK):
                            step.sink.write(block)
                    else:
                        await response.aread()
                    return response
            content = None if step.content is None else _each(step.content)
            return await self._http.request(**step.request(), content=content)
        except BaseException as exc:  # the flow's own cleanup runs, and it raises on
            return exc

    async def _run(self, flow: Flow[T]) -> T:
        stepper = Stepper(flow)
        for step in stepper:
            stepper.answer = await self._carry(step)
        return stepper.result  # type: ignore[no-any-return]

    async def _iterate(self, flow: Flow[None]) -> AsyncIterator[Any]:
        """Carry out ``flow``, yielding its items."""
        stepper = Stepper(flow)
        for step in stepper:
            if isinstance(step, Item):
                yield step.value
            else:
                stepper.answer = await self._carry(step)

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self._run(call(Send(method, path, **kwargs), self.retry))

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return await self._run(_flows.json_of(Send(method, path, **kwargs), self.retry))

    async def submit(self, template: str, *, idempotency_key: str | None = None, **job: Unpack[JobArgs]) -> AsyncJob:
        """``Client.submit``, awaited; an array job's tasks: ``await client.tasks(job.id)``."""
        data, replayed = await self._run(_flows.submit(template, self.retry, idempotency_key, **job))
        return AsyncJob(self, data, replayed=replayed)

    async def quote(self, template: str, **job: Unpack[JobArgs]) -> dict[str, Any]:
        """``Client.quote``, awaited: the worst-case cost and Slurm's start estimate; submits nothing."""
        return await self._run(_flows.quote(template, self.retry, **job))

    async def job(self, job_id: str) -> AsyncJob:
        return AsyncJob(self, await self._json("GET", f"/jobs/{job_id}"))

    async def tasks(self, job_id: str, *, page_size: int = 200) -> list[dict[str, Any]]:
        """Every task of an array job, in index order, as the API's JSON objects."""
        return await self._run(_flows.every_page(f"/jobs/{job_id}/tasks", "tasks", page_size, self.retry))

    async def session(self, job_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/jobs/{job_id}/session")  # type: ignore[no-any-return]

    async def wait_session(
        self, job_id: str, timeout: float | None = None, *, poll_s: float = 1.0, max_poll_s: float = 5.0
    ) -> dict[str, Any]:
        return await self._run(_flows.wait_session(job_id, self.retry, timeout, poll_s, max_poll_s))

    async def start_session(self, template: str, *, timeout: float | None = None, **submit_args: Any) -> dict[str, Any]:
        job = await self.submit(template, **submit_args)
        return await self.wait_session(job.id, timeout)

    async def cancel(self, job_id: str) -> AsyncJob:
        return AsyncJob(self, await self._json("DELETE", f"/jobs/{job_id}"))

    async def jobs(
        self, *, state: str | Iterable[str] | None = None, limit: int | None = None, page_size: int = 200
    ) -> AsyncIterator[AsyncJob]:
        async for data in self._iterate(_flows.jobs(state, limit, page_size, self.retry)):
            yield AsyncJob(self, data)

    async def logs(self, job_id: str, *, stream: str = "stdout", tail: int | None = None) -> str:
        return await self._run(_flows.logs(f"/jobs/{job_id}/logs", stream, tail, self.retry))

    def follow(self, job_id: str, *, stream: str = "stdout", offset: int = 0) -> AsyncIterator[str]:
        return self._iterate(_flows.follow(job_id, stream, offset, self.retry))

    async def templates(self) -> list[dict[str, Any]]:
        return (await self._json("GET", "/templates"))["templates"]  # type: ignore[no-any-return]

    async def usage(self, period: str | None = None) -> dict[str, Any]:
        return await self._json("GET", "/usage", params={"period": period} if period else None)  # type: ignore[no-any-return]

    async def invoice(self, period: str, path: str | os.PathLike[str] | None = None) -> Path:
        return await self._run(_flows.invoice(period, None if path is None else Path(path), self.retry))

    # -- the account's storage (/files): Client's methods, awaited ---------------------------

    async def upload_offset(self, remote: str) -> int:
        return await self._run(_flows.upload_offset(remote))

    async def upload(
        self, local: str | os.PathLike[str], remote: str, *, resume: bool = False, progress: Progress | None = None
    ) -> dict[str, Any]:
        """As ``Client.upload``."""
        return await self._run(_flows.upload(Path(local), remote, resume, progress, self.retry))

    async def download(self, remote: str, local: str | os.PathLike[str], *, progress: Progress | None = None) -> Path:
        """As ``Client.download``."""
        return await self._run(_flows.download(remote, Path(local), progress, self.retry))

    async def list_files(self, folder: str = "", *, page_size: int = 1000) -> list[dict[str, Any]]:
        return await self._run(_flows.list_files(folder, page_size, self.retry))

    async def delete_file(self, remote: str, *, recursive: bool = False) -> None:
        await self._request("DELETE", files_path(remote), params={"recursive": "true"} if recursive else None)

    async def move_file(self, remote: str, target: str, *, overwrite: bool = False) -> dict[str, Any]:
        params = {"move_to": target, **({"overwrite": "true"} if overwrite else {})}
        return await self._json("POST", files_path(remote), params=params)  # type: ignore[no-any-return]


async def _each(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
