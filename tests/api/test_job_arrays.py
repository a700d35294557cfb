"""Array jobs and sweeps through the API on the real cluster, checked against Slurm's own answers.

The 20-task sweep holds at most 2 GPUs (max_parallel 2, one GPU per task) for about
half a minute: each task prints its value and sleeps a second.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import uuid
from pathlib import Path
from typing import Any

from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from billing import passes
from billing.calendar import period_of
from billing.prices import set_price
from gpupool.config import Settings
from gpupool.db import utcnow
from gpupool.models import Account
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import parse_array_job_id, parse_delimited, parse_time
from tests.conftest import slurm_cmd, wait_for, wait_for_state


def _sweep_values(sentinel: Path) -> list[str]:
    hostile = ["a'; echo foo", "a\n0", f"$(touch {sentinel})"]
    # The three strings as they are, then each again under the task's own index.
    return hostile + [f"{index}:{hostile[index % 3]}" for index in range(3, 20)]


def _tasks(client: FlaskClient, job_id: str, auth: dict[str, str]) -> list[dict[str, Any]]:
    first = client.get(f"/jobs/{job_id}/tasks?limit=15", headers=auth)
    assert first.status_code == 200, first.get_json()
    page = first.get_json()
    tasks = page["tasks"]
    assert len(tasks) == 15 and page["next_cursor"] == "15"
    rest = client.get(f"/jobs/{job_id}/tasks?limit=15&cursor={page['next_cursor']}", headers=auth).get_json()
    assert rest["next_cursor"] is None
    return tasks + rest["tasks"]


def _accounted_tasks(array_id: int) -> list[dict[str, str]]:
    text = slurm_cmd("sacct", "--allusers", "-X", "-P", "-j", str(array_id), "-o", "JobID,JobIDRaw,State,Start,End,ElapsedRaw")
    return parse_delimited(text)


def _most_at_once(rows: list[dict[str, str]]) -> int:
    """The most tasks whose [Start, End) overlap at one moment, by sacct's own times."""
    events: list[tuple[dt.datetime, int]] = []
    for row in rows:
        start, end = parse_time(row["Start"]), parse_time(row["End"])
        if start is not None and end is not None:
            events += [(start, 1), (end, -1)]
    running = most = 0
    for _, change in sorted(events, key=lambda event: (event[0], event[1])):  # an end before a start at the same second
        running += change
        most = max(most, running)
    return most


def test_a_sweep_of_20_tasks_runs_2_at_once_each_with_its_own_value(
    client: FlaskClient,
    auth: dict[str, str],
    account: str,
    settings: Settings,
    session_factory: sessionmaker,
    slurm: SlurmClient,
    tmp_path: Path,
) -> None:
    sentinel = Path("/tmp") / f"gpupool-array-pwned-{uuid.uuid4().hex}"
    values = _sweep_values(sentinel)
    with session_factory() as session, session.begin():
        set_price(session, "*", 100_000, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    since = utcnow() - dt.timedelta(minutes=1)
    response = client.post(
        "/submit", headers=auth,
        json={"template": "hello", "gpus": 1, "params": {"seconds": 1}, "sweep": {"message": values}, "array": {"max_parallel": 2}},
    )
    assert response.status_code == 201, response.get_json()
    created = response.get_json()
    job_id, array_id = created["job_id"], created["slurm_job_id"]
    assert created["array"] == {"count": 20, "max_parallel": 2, "sweep_param": "message", "states": {"PENDING": 20}}
    assert created["params"] == {"seconds": 1}

    # Cancel the last task while it waits: the others go on.
    cancelled = client.delete(f"/jobs/{job_id}/tasks/19", headers=auth)
    assert cancelled.status_code == 202, cancelled.get_json()
    assert cancelled.get_json()["slurm_job_id"] == f"{array_id}_19"
    wait_for(lambda: client.get(f"/jobs/{job_id}/tasks/19", headers=auth).get_json()["state"] == "CANCELLED",
             timeout_s=60, what="task 19 to be cancelled")
    going_on = client.get(f"/jobs/{job_id}", headers=auth).get_json()
    assert going_on["state"] in ("PENDING", "RUNNING") and not going_on["array"]["states"].get("CANCELLED", 0) > 1

    done = wait_for_state(client, job_id, auth, {"COMPLETED", "FAILED", "CANCELLED"}, timeout_s=300)
    # The first task (by index) that did not complete names the job's state.
    assert done["state"] == "CANCELLED"
    assert done["array"]["states"] == {"CANCELLED": 1, "COMPLETED": 19}

    tasks = _tasks(client, job_id, auth)
    assert [task["index"] for task in tasks] == list(range(20))
    for task, value in zip(tasks, values, strict=True):
        assert task["value"] == value
        assert task["slurm_job_id"] == f"{array_id}_{task['index']}"
        if task["index"] == 19:
            assert task["state"] == "CANCELLED"
            continue
        assert (task["state"], task["exit_code"]) == ("COMPLETED", 0)
        assert task["gpu_seconds"] == task["elapsed_s"] >= 1
        log = client.get(f"/jobs/{job_id}/tasks/{task['index']}/logs", headers=auth)
        assert log.status_code == 200
        assert log.headers["Gpupool-Job-State"] == "COMPLETED"
        assert log.get_data() == f"gpus on node: 1\nvisible devices: unset\n{value}\n".encode()
    assert not sentinel.exists()
    # An array job's logs are its tasks'.
    assert client.get(f"/jobs/{job_id}/logs", headers=auth).get_json()["error"] == "array_job_logs"

    # Slurm's own record: 19 task runs, never more than 2 at once. The last was cancelled before it
    # ran, which (Slurm 22.05) only drops it from the array's pending record: it has no row at all.
    rows = wait_for(
        lambda: (found := _accounted_tasks(array_id)) and all(parse_time(row["End"]) for row in found) and found,
        timeout_s=60, what="sacct to have every task's end",
    )
    assert {row["JobID"] for row in rows} == {f"{array_id}_{index}" for index in range(19)}
    assert all(row["State"] == "COMPLETED" for row in rows)
    assert _most_at_once(rows) == 2

    # The billing pass meters each task's run; the invoice has a line for each, under this job.
    report = passes.run_pass(session_factory, slurm, settings.replace(billing_archive_dir=str(tmp_path / "archive")), since=since)
    assert report.runs >= 19
    invoice = client.get(f"/invoices/{period_of(utcnow())}", headers=auth)
    assert invoice.status_code == 200
    # The account is the test session's: other tests' jobs are on its invoice too. This array's lines
    # are those under its job or its Slurm id, so a line billed under the wrong one still shows.
    lines = [
        line for line in csv.DictReader(io.StringIO(invoice.get_data(as_text=True)))
        if line["line_type"] == "job"
        and (line["gpupool_job_id"] == job_id or line["slurm_job_id"].split("_")[0] == str(array_id))
    ]
    ran = {task["slurm_job_id"]: task for task in tasks if task["index"] != 19}
    assert {line["slurm_job_id"] for line in lines} == set(ran)
    assert len(lines) == 19
    for line in lines:
        assert line["gpupool_job_id"] == job_id
        assert int(line["gpu_seconds"]) == ran[line["slurm_job_id"]]["gpu_seconds"]


def test_cancelling_an_array_job_cancels_every_task(client: FlaskClient, auth: dict[str, str]) -> None:
    response = client.post(
        "/submit", headers=auth,
        json={"template": "hello", "gpus": 1, "params": {"seconds": 300}, "array": {"count": 3, "max_parallel": 1}},
    )
    assert response.status_code == 201, response.get_json()
    created = response.get_json()
    wait_for_state(client, created["job_id"], auth, {"RUNNING"}, timeout_s=120)
    assert client.delete(f"/jobs/{created['job_id']}", headers=auth).status_code == 202
    done = wait_for_state(client, created["job_id"], auth, {"CANCELLED", "COMPLETED", "FAILED"}, timeout_s=120)
    assert done["state"] == "CANCELLED"
    assert done["array"]["states"] == {"CANCELLED": 3}
    # Slurm's record: the task that ran (123_0) and the array's record of those that never did (123_[1-2%1]).
    def covered() -> set[int] | None:
        rows = _accounted_tasks(created["slurm_job_id"])
        if not rows or not all(row["State"].startswith("CANCELLED") for row in rows):
            return None
        found = {index for row in rows if (ids := parse_array_job_id(row["JobID"])) for index in ids.tasks}
        return found if found == {0, 1, 2} else None

    wait_for(covered, timeout_s=60, what="sacct to show every task cancelled")
    # A task that has ended cannot be cancelled again.
    again = client.delete(f"/jobs/{created['job_id']}/tasks/0", headers=auth)
    assert (again.status_code, again.get_json()["error"]) == (409, "task_finished")


def test_array_requests_that_are_refused(client: FlaskClient, auth: dict[str, str], settings: Settings) -> None:
    limit = settings.max_array_tasks
    cases: list[tuple[dict[str, Any], str]] = [
        ({"template": "hello", "array": {"count": limit + 1}}, f"at most {limit}"),
        ({"template": "hello", "array": {"count": 0}}, "array.count"),
        ({"template": "hello", "array": {"max_parallel": 2}}, "array.count is required"),
        ({"template": "hello", "sweep": {"nosuch": ["a"]}}, "no parameter 'nosuch'"),
        ({"template": "hello", "sweep": {"message": ["a"], "seconds": [1]}}, "exactly one parameter"),
        ({"template": "hello", "sweep": {"message": []}}, "at least one value"),
        ({"template": "hello", "sweep": {"message": ["a"]}, "params": {"message": "b"}}, "in sweep only"),
        ({"template": "hello", "sweep": {"seconds": [1, "x"]}}, "sweep value 1"),
        ({"template": "hello", "sweep": {"message": ["a\x00"]}}, "sweep value 0"),
        ({"template": "hello", "sweep": {"message": ["a", "b"]}, "array": {"count": 3}}, "the sweep has 2 values"),
        ({"template": "jupyter", "array": {"count": 2}}, "cannot be array jobs"),
    ]
    for body, message in cases:
        response = client.post("/submit", headers=auth, json=body)
        assert response.status_code == 422, (body, response.get_json())
        assert message in response.get_json()["message"], (body, response.get_json())
    single = client.post("/submit", headers=auth, json={"template": "hello", "params": {"seconds": 0}}).get_json()
    assert single["array"] is None
    assert client.get(f"/jobs/{single['job_id']}/tasks", headers=auth).get_json()["error"] == "not_an_array"


def test_the_budget_check_counts_every_tasks_worst_case(
    client: FlaskClient, auth: dict[str, str], account: str, session_factory: sessionmaker
) -> None:
    with session_factory() as session, session.begin():
        set_price(session, "*", 100_000, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        session.get(Account, account).prepaid_credit_nanos = 1_000_000_000  # type: ignore[union-attr]
    # One task: 1 GPU x 60 min x 0.0001 = 0.36, which fits; three of them (1.08) do not.
    body = {"template": "hello", "gpus": 1, "time_limit_min": 60, "array": {"count": 3}}
    refused = client.post("/submit", headers=auth, json=body)
    assert refused.status_code == 402, refused.get_json()
    assert refused.get_json()["required"] == "1.08"
    assert "3 task(s) x 1 GPU(s) x 60 min" in refused.get_json()["message"]
    with session_factory() as session, session.begin():
        session.get(Account, account).prepaid_credit_nanos = 2_000_000_000  # type: ignore[union-attr]
    fits = client.post("/submit", headers=auth, json={**body, "array": {"count": 3, "max_parallel": 1}, "params": {"seconds": 0}})
    assert fits.status_code == 201, fits.get_json()
    # The queued array's three worst cases count against the next submit: 2.00 - 1.08 < 0.36 x 3.
    again = client.post("/submit", headers=auth, json=body)
    assert again.status_code == 402
