"""Jobs through the API on the real cluster, checked against Slurm's own answers."""

from __future__ import annotations

import base64
import socket

import pytest
from flask.testing import FlaskClient

from gpupool.config import Settings
from tests.conftest import bearer, sacct_row, slurm_cmd, utc, wait_for, wait_for_state

HOSTILE_MESSAGE = "a'; echo foo\n#SBATCH --account=root\n$(touch /tmp/gpupool-pwned) `id` | # \"q\" \\"


def submit(client: FlaskClient, headers: dict[str, str], **body: object) -> dict:
    response = client.post("/submit", headers=headers, json=body)
    assert response.status_code == 201, response.get_json()
    assert response.headers["Location"] == f"/jobs/{response.get_json()['job_id']}"
    return response.get_json()


def test_job_runs_to_completion_and_slurm_bills_the_right_account(
    client: FlaskClient, auth: dict[str, str], account: str, settings: Settings
) -> None:
    created = submit(client, auth, template="hello", gpus=2, params={"message": HOSTILE_MESSAGE, "seconds": 1})
    assert created["state"] == "PENDING"
    assert isinstance(created["slurm_job_id"], int)

    done = wait_for_state(client, created["job_id"], auth, {"COMPLETED", "FAILED"})
    assert done["state"] == "COMPLETED"
    assert done["exit_code"] == 0
    assert done["node"] == socket.gethostname()
    assert utc(done["ended_at"]) >= utc(done["started_at"]) >= utc(done["submitted_at"])
    assert done["elapsed_s"] >= 1
    assert done["reason"] is None

    record = sacct_row(created["slurm_job_id"])
    assert record["Account"] == account
    assert "gres/gpu=2" in record["AllocTRES"].split(",")
    assert record["Comment"] == f"gpupool:{created['job_id']}"
    assert record["State"] == "COMPLETED"
    assert int(record["ElapsedRaw"]) == done["elapsed_s"]

    logs = client.get(f"/jobs/{created['job_id']}/logs", headers=auth)
    assert logs.status_code == 200
    assert logs.mimetype == "text/plain"
    assert logs.get_data(as_text=True) == f"gpus on node: 2\nvisible devices: unset\n{HOSTILE_MESSAGE}\n"
    tail = client.get(f"/jobs/{created['job_id']}/logs?tail=1", headers=auth).get_data(as_text=True)
    assert tail == HOSTILE_MESSAGE.splitlines()[-1] + "\n"
    for bad in ("stream=stdin", "tail=0", "tail=10001", "tail=many"):
        response = client.get(f"/jobs/{created['job_id']}/logs?{bad}", headers=auth)
        assert response.status_code == 400, bad
        assert response.get_json()["error"] == "bad_request"


def test_failed_job_reports_exit_code_and_stderr(client: FlaskClient, auth: dict[str, str]) -> None:
    created = submit(client, auth, template="fail", gpus=1)
    done = wait_for_state(client, created["job_id"], auth, {"COMPLETED", "FAILED"})
    assert (done["state"], done["exit_code"]) == ("FAILED", 3)
    assert sacct_row(created["slurm_job_id"])["ExitCode"] == "3:0"
    stderr = client.get(f"/jobs/{created['job_id']}/logs?stream=stderr", headers=auth)
    assert stderr.get_data(as_text=True) == "failing\n"


def test_job_gets_a_minimal_environment_without_service_secrets(
    client: FlaskClient, auth: dict[str, str], account: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What an operator's shell might hold when it starts the service.
    monkeypatch.setenv("GPUPOOL_JWT_SECRET", "operator-secret-value-0123456789abcdef")
    monkeypatch.setenv("GPUPOOL_DATABASE_URL", "postgresql://gpupool:hunter2@db/gpupool")
    monkeypatch.setenv("SBATCH_ACCOUNT", "root")
    monkeypatch.setenv("SBATCH_TIMELIMIT", "1")
    created = submit(client, auth, template="envdump", gpus=1)
    done = wait_for_state(client, created["job_id"], auth, {"COMPLETED", "FAILED"})
    assert done["state"] == "COMPLETED"
    env = client.get(f"/jobs/{created['job_id']}/logs?tail=1000", headers=auth).get_data(as_text=True)
    names = {line.split("=", 1)[0] for line in env.splitlines() if "=" in line}
    assert "SLURM_JOB_ID" in names  # it really is the job's environment
    assert not {name for name in names if name.startswith(("SBATCH_", "GPUPOOL_JWT", "GPUPOOL_DATABASE"))}
    assert "hunter2" not in env and "operator-secret-value" not in env and "k" * 40 not in env
    assert sacct_row(created["slurm_job_id"])["Account"] == account


def test_job_pends_for_resources_while_others_hold_the_gpus(
    client: FlaskClient, auth: dict[str, str], settings: Settings, other_account: str
) -> None:
    other = bearer(settings, other_account, sub="bob")
    holder = submit(client, other, template="hello", gpus=4, params={"seconds": 300})
    wait_for_state(client, holder["job_id"], other, {"RUNNING"})

    waiting = submit(client, auth, template="hello", gpus=1, params={"seconds": 0})
    pending = wait_for(
        lambda: (body := client.get(f"/jobs/{waiting['job_id']}", headers=auth).get_json())["reason"] == "Resources"
        and body,
        what="reason Resources",
        timeout_s=30,
    )
    assert pending["state"] == "PENDING"
    assert pending["started_at"] is None and pending["node"] is None
    not_started = client.get(f"/jobs/{waiting['job_id']}/logs", headers=auth)
    assert (not_started.status_code, not_started.get_data()) == (200, b"")
    reason = slurm_cmd("squeue", "-h", "-j", str(waiting["slurm_job_id"]), "-o", "%T|%r").strip()
    assert reason == "PENDING|Resources"

    listed = client.get("/jobs?state=PENDING", headers=auth).get_json()
    assert [job["job_id"] for job in listed["jobs"]] == [waiting["job_id"]]
    assert client.get("/jobs?state=RUNNING", headers=auth).get_json()["jobs"] == []

    # Freeing the GPUs lets the waiting job run.
    assert client.delete(f"/jobs/{holder['job_id']}", headers=other).status_code == 202
    done = wait_for_state(client, waiting["job_id"], auth, {"COMPLETED"})
    assert done["exit_code"] == 0


def test_cancelling_a_running_job(client: FlaskClient, auth: dict[str, str]) -> None:
    created = submit(client, auth, template="hello", gpus=1, params={"seconds": 600})
    wait_for_state(client, created["job_id"], auth, {"RUNNING"})

    response = client.delete(f"/jobs/{created['job_id']}", headers=auth)
    assert response.status_code == 202
    assert response.get_json()["job_id"] == created["job_id"]

    done = wait_for_state(client, created["job_id"], auth, {"CANCELLED"})
    assert done["ended_at"] is not None
    assert sacct_row(created["slurm_job_id"])["State"].startswith("CANCELLED")

    again = client.delete(f"/jobs/{created['job_id']}", headers=auth)
    assert again.status_code == 409
    assert again.get_json()["error"] == "job_finished"


def test_list_is_newest_first_with_cursor_pages_and_state_filter(client: FlaskClient, auth: dict[str, str]) -> None:
    ids = [submit(client, auth, template="hello", gpus=1, name=f"job-{i}")["job_id"] for i in range(3)]

    first = client.get("/jobs?limit=2", headers=auth).get_json()
    assert [job["job_id"] for job in first["jobs"]] == ids[::-1][:2]
    assert first["next_cursor"]
    second = client.get(f"/jobs?limit=2&cursor={first['next_cursor']}", headers=auth).get_json()
    assert [job["job_id"] for job in second["jobs"]] == [ids[0]]
    assert second["next_cursor"] is None
    assert [job["name"] for job in first["jobs"] + second["jobs"]] == ["job-2", "job-1", "job-0"]

    for job_id in ids:
        wait_for_state(client, job_id, auth, {"COMPLETED"})
    completed = client.get("/jobs?state=completed", headers=auth).get_json()["jobs"]
    assert {job["job_id"] for job in completed} == set(ids)

    bad = client.get("/jobs?state=DONE", headers=auth)
    assert bad.status_code == 400
    assert "DONE" in bad.get_json()["message"]
    assert client.get("/jobs?cursor=!!notours", headers=auth).status_code == 400
    naive = base64.urlsafe_b64encode(b"2026-01-01T00:00:00|x").decode()
    assert client.get(f"/jobs?cursor={naive}", headers=auth).get_json()["error"] == "bad_request"
    assert client.get("/jobs?limit=x", headers=auth).get_json()["message"] == "limit must be an integer"
    assert client.get("/jobs?limit=0", headers=auth).status_code == 400


@pytest.mark.slow
def test_state_comes_from_sacct_once_squeue_forgets_the_job(client: FlaskClient, auth: dict[str, str]) -> None:
    created = submit(client, auth, template="hello", gpus=1, params={"message": "bye"})
    slurm_id = str(created["slurm_job_id"])
    # Not polling the API meanwhile: slurmctld purges it after MinJobAge (5 s here).
    wait_for(
        lambda: slurm_cmd("squeue", "-h", "-t", "all", "-o", "%i", check=False).split().count(slurm_id) == 0,
        timeout_s=150,
        interval_s=2,
        what="squeue to forget the job",
    )
    body = client.get(f"/jobs/{created['job_id']}", headers=auth).get_json()
    assert body["state"] == "COMPLETED"
    assert body["exit_code"] == 0
    assert body["elapsed_s"] == int(sacct_row(created["slurm_job_id"])["ElapsedRaw"])
