"""The customers' `gpupool-client` command: exit codes that say how the job ended, and the reads."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest
from gpupool_client import Client

from tests.conftest import wait_for
from tests.live.conftest import Server, http

GPUPOOL_CLIENT = str(Path(sys.executable).parent / "gpupool-client")


def cli_env(server: Server, token: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": token}


def run_cli(server: Server, token: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUPOOL_CLIENT, *args], env=cli_env(server, token), capture_output=True, text=True, timeout=timeout_s, check=False
    )


def submitted_id(stderr_line: str) -> str:
    assert stderr_line.startswith("submitted job "), stderr_line
    return stderr_line.split()[-1]


def test_wait_exits_with_the_jobs_own_exit_code(server: Server, token: str) -> None:
    completed = run_cli(server, token, "submit", "hello", "--gpus", "1", "-p", "message=hi there", "-p", "seconds=0", "--wait")
    assert completed.returncode == 0, completed.stderr
    assert "COMPLETED exit 0" in completed.stderr

    failed = run_cli(server, token, "submit", "fail", "--wait", "--json")
    assert failed.returncode == 3, failed.stderr
    assert json.loads(failed.stdout)["state"] == "FAILED"


def test_follow_prints_the_output_then_exits_with_the_code(server: Server, token: str) -> None:
    followed = run_cli(server, token, "submit", "count", "-p", "lines=2500", "--follow")
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == "".join(f"line {n}\n" for n in range(1, 2501))


def test_wait_exits_130_when_the_job_is_cancelled(server: Server, token: str, client: Client) -> None:
    waiting = subprocess.Popen(
        [GPUPOOL_CLIENT, "submit", "hello", "-p", "seconds=300", "--wait"],
        env=cli_env(server, token), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )
    assert waiting.stderr is not None
    job = client.job(submitted_id(waiting.stderr.readline()))
    wait_for(lambda: job.refresh().state == "RUNNING", what="the job to start")
    client.cancel(job.id)
    assert waiting.wait(timeout=120) == 130
    assert "CANCELLED" in waiting.stderr.read()


@pytest.mark.slow
def test_wait_exits_124_when_the_job_hits_its_time_limit(server: Server, token: str) -> None:
    # One minute is Slurm's smallest limit; the job is killed after it and KillWait.
    timed_out = run_cli(server, token, "submit", "hello", "-p", "seconds=600", "--time-limit", "1", "--wait")
    assert timed_out.returncode == 124, timed_out.stderr
    assert "TIMEOUT" in timed_out.stderr


def test_reads_print_what_the_api_says(server: Server, token: str, tmp_path: Path) -> None:
    # "42" in JSON quotes stays text; a bare 0 is a number, as the template's integer wants.
    job_id = run_cli(server, token, "submit", "hello", "-p", 'message="42"', "-p", "seconds=0").stdout.strip()
    status = json.loads(run_cli(server, token, "status", job_id, "--json").stdout)
    assert (status["job_id"], status["params"]) == (job_id, {"message": "42", "seconds": 0})
    with Client(server.url, token) as api:
        api.job(job_id).wait(timeout=120)

    assert run_cli(server, token, "logs", job_id).stdout.splitlines()[-1] == "42"
    assert run_cli(server, token, "logs", job_id, "-f").stdout.splitlines()[-1] == "42"
    refused = run_cli(server, token, "submit", "hello", "-p", "message=42")
    assert refused.returncode == 1 and "params.message" in refused.stderr
    listed = json.loads(run_cli(server, token, "jobs", "--json", "--limit", "1").stdout)
    assert [job["job_id"] for job in listed] == [job_id]
    assert "hello" in {t["name"] for t in json.loads(run_cli(server, token, "templates", "--json").stdout)}
    period = dt.datetime.now(dt.UTC).strftime("%Y-%m")
    assert json.loads(run_cli(server, token, "usage", "--json", "--period", period).stdout)["period"] == period
    out = tmp_path / "invoice.csv"
    assert run_cli(server, token, "invoice", period, "-o", str(out)).returncode == 0
    assert out.read_bytes() == http("GET", f"{server.url}/invoices/{period}", token=token).body.encode()

    missing = run_cli(server, token, "status", "00000000-0000-4000-8000-000000000000")
    assert missing.returncode == 1 and "no job" in missing.stderr


def test_dry_run_prints_the_quote_and_submits_nothing(server: Server, token: str, client: Client) -> None:
    before = [job.id for job in client.jobs(limit=200)]
    quoted = run_cli(server, token, "submit", "hello", "--gpus", "2", "--time-limit", "3", "--dry-run", "--json")
    assert quoted.returncode == 0, quoted.stderr
    answer = json.loads(quoted.stdout)
    assert answer["dry_run"] is True
    assert answer["quote"]["gpu_seconds_worst_case"] == 2 * 3 * 60
    assert answer == {**client.quote("hello", gpus=2, time_limit_min=3), "estimated_start": answer["estimated_start"]}
    shown = run_cli(server, token, "submit", "hello", "--gpus", "2", "--time-limit", "3", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "GPU-seconds:      360 (2 GPU(s) x 3 min)" in shown.stdout and "estimated start:" in shown.stdout
    refused = run_cli(server, token, "submit", "hello", "--dry-run", "--wait")
    assert refused.returncode != 0 and "--dry-run submits nothing" in refused.stderr
    assert [job.id for job in client.jobs(limit=200)] == before
