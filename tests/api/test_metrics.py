"""GET /metrics on the real app, PostgreSQL and Slurm: what Prometheus would scrape.

Counters are process-wide and other tests move them too, so each test reads
the metrics before and after and checks the difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.errors import CommandFailed, CommandNotFound, ConfigError
from gpupool.slurm.client import SlurmClient
from tests.conftest import REPO, create_app_for_tests, wait_for

Samples = Mapping[tuple[str, frozenset[tuple[str, str]]], float]
HELLO = {"template": "hello", "gpus": 1, "params": {"message": "counted", "seconds": 30}}


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(client: FlaskClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    return parse(response.get_data(as_text=True))


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_a_submit_shows_in_the_counters(client: FlaskClient, auth: dict[str, str]) -> None:
    before = scrape(client)
    headers = {**auth, "Idempotency-Key": "metrics-1"}
    created = client.post("/submit", headers=headers, json=HELLO)
    assert created.status_code == 201, created.get_json()
    replayed = client.post("/submit", headers=headers, json=HELLO)
    assert replayed.headers["Idempotent-Replayed"] == "true"
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("gpupool_jobs_submitted_total", template="hello") == 1  # the replay is not a second job
    assert delta("gpupool_http_requests_total", method="POST", endpoint="submit.submit_job", status="201") == 2
    assert delta("gpupool_http_request_duration_seconds_count", method="POST", endpoint="submit.submit_job") == 2
    assert delta("gpupool_slurm_command_duration_seconds_count", command="sbatch") == 1
    assert delta("gpupool_http_requests_total", method="GET", endpoint="metrics.metrics", status="200") == 1


def test_refused_and_unrouted_requests_are_counted_under_bounded_labels(client: FlaskClient) -> None:
    before = scrape(client)
    assert client.get("/jobs").status_code == 401
    assert client.get("/jobs/6a1f0000-0000-4000-8000-000000000000/nowhere").status_code == 404
    after = scrape(client)
    assert value(after, "gpupool_http_requests_total", method="GET", endpoint="jobs.list_jobs", status="401") == (
        value(before, "gpupool_http_requests_total", method="GET", endpoint="jobs.list_jobs", status="401") + 1
    )
    # Timed although authentication refused it: the timer runs before the token check.
    assert value(after, "gpupool_http_request_duration_seconds_count", method="GET", endpoint="jobs.list_jobs") == (
        value(before, "gpupool_http_request_duration_seconds_count", method="GET", endpoint="jobs.list_jobs") + 1
    )
    assert value(after, "gpupool_http_requests_total", method="GET", endpoint="unmatched", status="404") == (
        value(before, "gpupool_http_requests_total", method="GET", endpoint="unmatched", status="404") + 1
    )
    assert not any("6a1f0000" in str(labels) for _, labels in after)


def test_refresher_passes_are_counted(client: FlaskClient, auth: dict[str, str]) -> None:
    created = client.post("/submit", headers=auth, json=HELLO).get_json()
    before = value(scrape(client), "gpupool_job_state_refresh_passes_total", outcome="ok")

    def refreshed() -> bool:
        client.get(f"/jobs/{created['job_id']}", headers=auth)
        return value(scrape(client), "gpupool_job_state_refresh_passes_total", outcome="ok") > before

    wait_for(refreshed, timeout_s=30, what="a job-state refresh pass to be counted")
    assert value(scrape(client), "gpupool_job_state_refresh_duration_seconds_count") >= 1


def test_failed_slurm_commands_are_counted_by_command_and_reason(
    client: FlaskClient, settings: Settings, tmp_path: Path
) -> None:
    failing = tmp_path / "squeue"
    failing.write_text("#!/bin/sh\necho 'squeue: error: Invalid user' >&2\nexit 1\n")
    failing.chmod(0o755)
    broken = SlurmClient(settings.replace(slurm_bin_dir=str(tmp_path)))
    before = scrape(client)
    with pytest.raises(CommandFailed):
        broken.queue()
    with pytest.raises(CommandNotFound):
        broken.ping()  # there is no scontrol in that folder
    after = scrape(client)
    for command, reason in (("squeue", "exit_status"), ("scontrol", "not_found")):
        labels = {"command": command, "reason": reason}
        assert value(after, "gpupool_slurm_command_failures_total", **labels) == (
            value(before, "gpupool_slurm_command_failures_total", **labels) + 1
        )
        assert value(after, "gpupool_slurm_command_duration_seconds_count", command=command) == (
            value(before, "gpupool_slurm_command_duration_seconds_count", command=command) + 1
        )


def test_metrics_need_no_token_and_are_hidden_from_other_addresses(client: FlaskClient) -> None:
    assert client.get("/metrics").status_code == 200  # no Authorization header
    assert client.get("/metrics", environ_base={"REMOTE_ADDR": "10.20.30.40"}).status_code == 200
    assert client.get("/metrics", environ_base={"REMOTE_ADDR": "::ffff:192.168.7.8"}).status_code == 200
    outside = {"REMOTE_ADDR": "203.0.113.9"}
    hidden = client.get("/metrics", environ_base=outside)
    missing = client.get("/no-such-path", environ_base=outside)
    assert hidden.status_code == missing.status_code == 404
    assert hidden.get_json() == missing.get_json()
    assert hidden.get_json()["error"] == "not_found"


def test_the_allowed_networks_are_a_setting(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker) -> None:
    def app_with(cidrs: tuple[str, ...]) -> Flask:
        return create_app_for_tests(settings.replace(metrics_allow_cidrs=cidrs), slurm, session_factory)

    closed = app_with(()).test_client()
    assert closed.get("/metrics").status_code == 404
    only_doc_net = app_with(("203.0.113.0/24",)).test_client()
    assert only_doc_net.get("/metrics").status_code == 404
    assert only_doc_net.get("/metrics", environ_base={"REMOTE_ADDR": "203.0.113.9"}).status_code == 200
    with pytest.raises(ConfigError, match="metrics_allow_cidrs: '10.0.0.0/33'"):
        app_with(("10.0.0.0/33",))


def test_server_timing_names_a_submits_stages_only_when_turned_on(
    client: FlaskClient, auth: dict[str, str], settings: Settings, slurm: SlurmClient, session_factory: sessionmaker
) -> None:
    assert "Server-Timing" not in client.get("/templates", headers=auth).headers  # off by default
    timed = create_app_for_tests(settings.replace(server_timing=True), slurm, session_factory).test_client()
    created = timed.post("/submit", headers={**auth, "Idempotency-Key": "timed-1"}, json=HELLO)
    assert created.status_code == 201, created.get_json()
    stages = [part.strip().split(";dur=") for part in created.headers["Server-Timing"].split(",")]
    assert [name for name, _ in stages] == ["admit", "budget", "render", "commit", "sbatch", "record", "total"]
    durations = {name: float(ms) for name, ms in stages}
    assert all(ms >= 0 for ms in durations.values())
    assert durations["total"] >= sum(ms for name, ms in durations.items() if name != "total")
    assert timed.delete(f"/jobs/{created.get_json()['job_id']}", headers=auth).status_code == 202


def test_multiprocess_mode_adds_up_every_worker(tmp_path: Path) -> None:
    """gunicorn workers are processes: with PROMETHEUS_MULTIPROC_DIR each writes files, any one reads all."""
    env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    worker = textwrap.dedent(
        """
        from gpupool.metrics import SLURM_COMMAND_FAILURES
        SLURM_COMMAND_FAILURES.labels(command="sbatch", reason="timeout").inc()
        """
    )
    reader = textwrap.dedent(
        """
        from prometheus_client import generate_latest
        from gpupool.metrics import exposition_registry
        print(generate_latest(exposition_registry()).decode())
        """
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", worker], env=env, cwd=REPO, check=True, timeout=60)
    read = subprocess.run(
        [sys.executable, "-c", reader], env=env, cwd=REPO, check=True, timeout=60, capture_output=True, text=True
    )
    samples = parse(read.stdout)
    assert value(samples, "gpupool_slurm_command_failures_total", command="sbatch", reason="timeout") == 2


def test_a_missing_multiprocess_folder_stops_the_app_at_start(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="PROMETHEUS_MULTIPROC_DIR names .*absent, which is not a folder"):
        create_app_for_tests(settings, slurm, session_factory)
    assert not os.path.exists(tmp_path / "absent")
