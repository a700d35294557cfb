"""gpupool_client's Client and AsyncClient against gunicorn, PostgreSQL, Redis and Slurm."""

from __future__ import annotations

import asyncio
import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gpupool_client import AsyncClient, Client, NotFound, Unauthorized, ValidationFailed

from tests.client.conftest import DroppingProxy, queued_with_tag
from tests.conftest import sacct_row, slurm_cmd, wait_for
from tests.live.conftest import Server, http


def test_submit_follow_every_line_once_in_order_then_wait(client: Client) -> None:
    job = client.submit("count", params={"lines": 10_000}, name="counting")
    assert job.state == "PENDING" and not job.replayed

    lines = list(job.follow())

    assert lines == [f"line {n}\n" for n in range(1, 10_001)]
    final = job.wait(timeout=120)
    assert (final.state, final.exit_code) == ("COMPLETED", 0)
    assert sacct_row(final.slurm_job_id)["State"] == "COMPLETED"
    assert job.logs(tail=2) == "line 9999\nline 10000\n"


def test_cancel_a_running_job(client: Client) -> None:
    job = client.submit("hello", params={"seconds": 300})
    wait_for(lambda: job.refresh().state == "RUNNING", what="the job to start")

    job.cancel()

    assert job.wait(timeout=120).state == "CANCELLED"
    assert sacct_row(job.slurm_job_id)["State"].startswith("CANCELLED")


def test_jobs_iterates_450_jobs_across_pages(pending_client: Client, pending_account: str) -> None:
    def submit(index: int) -> str:
        return pending_client.submit("hello", name=f"page-{index}").id

    with ThreadPoolExecutor(max_workers=8) as pool:
        submitted = list(pool.map(submit, range(450)))

    listed = [job.id for job in pending_client.jobs(state="PENDING")]
    assert sorted(listed) == sorted(submitted)  # each once: 450 of them over 3 pages of 200
    assert [job.id for job in pending_client.jobs(limit=250, page_size=100)] == listed[:250]
    assert list(pending_client.jobs(state=["COMPLETED", "FAILED"])) == []
    assert len(slurm_cmd("squeue", "-h", "-a", f"--account={pending_account}", "-o", "%i").split()) == 450


def test_invoice_download_is_the_api_csv_byte_for_byte(
    client: Client, server: Server, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    period = dt.datetime.now(dt.UTC).strftime("%Y-%m")
    direct = http("GET", f"{server.url}/invoices/{period}", token=token)
    assert direct.status == 200

    saved = client.invoice(period, tmp_path / "mine.csv")

    assert saved.read_bytes() == direct.body.encode()
    monkeypatch.chdir(tmp_path)
    named = client.invoice(period)
    assert named.parent == Path(".") and named.suffix == ".csv" and named.name != "mine.csv"
    assert named.read_bytes() == saved.read_bytes()
    assert not list(tmp_path.glob("*.part"))


def test_a_submit_whose_answer_is_lost_is_retried_and_makes_one_job(
    dropping_proxy: DroppingProxy, pending_token: str, pending_account: str
) -> None:
    with Client(dropping_proxy.url, pending_token) as through_proxy:
        job = through_proxy.submit("hello", params={"message": "once"})

    assert dropping_proxy.dropped == 1
    first_key, *retries = dropping_proxy.submit_keys
    assert first_key and retries and set(retries) == {first_key}
    assert job.replayed  # the server answered the retry from the job the lost answer announced
    assert len(queued_with_tag(pending_account, job.id)) == 1
    assert queued_with_tag(pending_account, job.id) == [str(job.slurm_job_id)]


def test_errors_are_typed_from_the_api_codes(client: Client, server: Server) -> None:
    with pytest.raises(NotFound):
        client.job("00000000-0000-4000-8000-000000000000")
    with pytest.raises(ValidationFailed) as invalid:
        client.submit("hello", params={"seconds": "soon"})
    assert [error["field"] for error in invalid.value.errors] == ["params.seconds"]
    with pytest.raises(ValidationFailed) as unknown:
        client.submit("no-such-template")
    assert unknown.value.status == 422
    with Client(server.url, "not-a-token") as stranger, pytest.raises(Unauthorized):
        stranger.templates()
    assert {"hello", "count", "fail"} <= {template["name"] for template in client.templates()}
    assert client.usage()["account"] == client.job(client.submit("hello").id).data["account"]


def test_async_client_submits_waits_follows_and_lists(server: Server, token: str) -> None:
    async def scenario() -> tuple[str, int | None, list[str], list[str], str]:
        async with AsyncClient(server.url, token) as api:
            job = await api.submit("count", params={"lines": 3})
            lines = [line async for line in job.follow()]
            await job.wait(timeout=120)
            listed = [listed.id async for listed in api.jobs(limit=5)]
            return job.state, job.exit_code, lines, listed, job.id

    state, exit_code, lines, listed, job_id = asyncio.run(scenario())
    assert (state, exit_code) == ("COMPLETED", 0)
    assert lines == ["line 1\n", "line 2\n", "line 3\n"]
    assert job_id in listed


def test_both_clients_quote_what_a_submit_would_cost(server: Server, token: str, client: Client) -> None:
    async def quoted() -> dict:
        async with AsyncClient(server.url, token) as api:
            return await api.quote("hello", gpus=1, time_limit_min=5)

    answer = client.quote("hello", gpus=1, time_limit_min=5)
    assert answer["quote"]["gpu_seconds_worst_case"] == 300 and answer["would_be_admitted"] is True
    assert asyncio.run(quoted())["quote"] == answer["quote"]
    # An array's quote counts every task, as its 402 would.
    assert client.quote("hello", gpus=1, time_limit_min=5, array=3)["quote"]["gpu_seconds_worst_case"] == 900
    with pytest.raises(ValidationFailed):
        client.quote("hello", params={"seconds": "soon"})


def test_map_runs_one_array_job_whose_tasks_have_their_values(client: Client) -> None:
    values = ["a'; echo foo", "a\n0", "$(touch /tmp/gpupool-client-map)"]
    tasks = client.map("hello", "message", values, max_parallel=2, params={"seconds": 0})
    assert [(task.index, task.value, task.state) for task in tasks] == [(i, value, "PENDING") for i, value in enumerate(values)]
    job = client.job(tasks[0].job_id)
    assert job.array == {"count": 3, "max_parallel": 2, "sweep_param": "message", "states": {"PENDING": 3}}
    assert job.wait(timeout=180).state == "COMPLETED"
    for task, value in zip(job.tasks(), values, strict=True):
        assert (task.state, task.exit_code) == ("COMPLETED", 0)
        assert task.logs(tail=1) == value.splitlines()[-1] + "\n"
        assert task.gpu_seconds is not None
    assert not Path("/tmp/gpupool-client-map").exists()


def test_submit_with_array_returns_the_job_of_its_tasks(client: Client) -> None:
    job = client.submit("hello", array=2, params={"seconds": 0})
    assert job.array is not None and job.array["count"] == 2
    assert [task.index for task in job.tasks()] == [0, 1]
    assert job.wait(timeout=180).array == {"count": 2, "max_parallel": None, "sweep_param": None, "states": {"COMPLETED": 2}}
