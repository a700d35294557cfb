"""The README's five-minute tour, run as written against a real server and the real cluster.

The README is the first thing a newcomer runs; its commands must keep working.
Each block runs in bash (curl made to fail on an HTTP error) or Python with only
GPUPOOL_URL and GPUPOOL_TOKEN set, as `make run`'s export leaves them.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.config import Settings
from gpupool_cli.main import build_parser
from tests.conftest import REPO, recorded_token
from tests.live.conftest import Server

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

README = REPO / "README.md"


def tour_blocks(language: str) -> list[str]:
    text = README.read_text()
    tour = text[text.index("## A five-minute tour"):]
    tour = tour[:tour.index("\n## ", 4)]
    return re.findall(rf"```{language}\n(.*?)```", tour, re.DOTALL)


def run_block(code: str, argv: list[str], server: Server, token: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": token, "HOME": str(cwd)}
    return subprocess.run([*argv, code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_tour_runs_as_written(
    start_server: Callable[..., Server], live_settings: Settings, slurm_account: str, tmp_path: Path
) -> None:
    server = start_server()
    token = recorded_token(live_settings, slurm_account, sub=f"tour-{secrets.token_hex(3)}")
    export, curls, bad_input, *_ = tour_blocks("sh")
    assert export.startswith("export GPUPOOL_URL=http://127.0.0.1:5000 GPUPOOL_TOKEN=$TOKEN")

    fail_on_http_errors = "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n"
    toured = run_block(fail_on_http_errors + curls, ["/bin/bash", "-c"], server, token, tmp_path)
    assert toured.returncode == 0, toured.stdout + toured.stderr
    answers = [json.loads(line) for line in toured.stdout.splitlines() if line.startswith(("{", "["))]
    templates, job, cancelled, usage = answers[0], answers[1], answers[-2], answers[-1]
    assert any(template["name"] == "hello" for template in templates["templates"]), templates
    assert job["account"] == slurm_account and job["template"] == "hello"
    assert cancelled["job_id"] == job["job_id"]
    assert usage["account"] == slurm_account
    invoices = list(tmp_path.glob("*.csv"))
    assert len(invoices) == 1 and invoices[0].read_text().startswith("line_type,"), invoices

    # Typed into the same shell: $H is still set.
    assert curls.startswith('H="Authorization: Bearer $GPUPOOL_TOKEN"\n')
    refused = run_block(curls.splitlines()[0] + "\n" + bad_input, ["/bin/bash", "-c"], server, token, tmp_path)
    answer = json.loads(refused.stdout)
    assert answer["error"] == "validation_failed" and "unknown template 'nope'" in answer["message"], answer
    assert "422" in bad_input.split("# ", 1)[1] and '"error": "validation_failed"' in bad_input

    (python,) = tour_blocks("python")
    ran = run_block(python, [sys.executable, "-c"], server, token, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "COMPLETED", ran.stdout
    assert (tmp_path / "invoice.csv").read_text().startswith("line_type,")


def test_the_quotes_spot_and_arrays_section_runs_as_written(
    start_server: Callable[..., Server], live_settings: Settings, slurm_account: str, tmp_path: Path
) -> None:
    server = start_server()
    token = recorded_token(live_settings, slurm_account, sub=f"tour-{secrets.token_hex(3)}")
    (curls,) = section_blocks("## Quotes, spot jobs and arrays", "sh")
    fail_on_http_errors = "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n"
    ran = run_block(fail_on_http_errors + curls, ["/bin/bash", "-c"], server, token, tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    quote, spot, sweep = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    submitted = [spot["job_id"], sweep["job_id"]]
    try:
        assert quote["dry_run"] is True and "job_id" not in quote and quote["quote"]["gpus"] == 1, quote
        assert spot["preemptible"] is True and spot["run_count"] == 0, spot
        assert sweep["array"] == {"count": 3, "max_parallel": 2, "sweep_param": "message", "states": {"PENDING": 3}}, sweep

        (python,) = section_blocks("## Quotes, spot jobs and arrays", "python")
        prelude = "from gpupool_client import Client\nclient = Client()\n"
        epilogue = "\nimport json; print(json.dumps({'quote': quote, 'job_id': tasks[0].job_id, 'values': [t.data['value'] for t in tasks]}))\n"
        ran = run_block(prelude + python + epilogue, [sys.executable, "-c"], server, token, tmp_path)
        assert ran.returncode == 0, ran.stderr
        answer = json.loads(ran.stdout.splitlines()[-1])
        submitted.append(answer["job_id"])
        assert answer["quote"]["dry_run"] is True and answer["quote"]["quote"] == quote["quote"], answer
        assert answer["values"] == ["a", "b", "c"], answer
    finally:
        for job_id in submitted:
            request = urllib.request.Request(
                f"{server.url}/jobs/{job_id}", method="DELETE", headers={"Authorization": f"Bearer {token}"}
            )
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(request, timeout=30).close()


def section_blocks(heading: str, language: str) -> list[str]:
    text = README.read_text()
    section = text[text.index(heading):]
    section = section[:section.index("\n## ", 4)]
    return re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)


def test_the_teams_section_runs_as_written(
    start_server: Callable[..., Server], live_settings: Settings, slurm_account: str, tmp_path: Path
) -> None:
    server = start_server()
    subject = f"tour-{secrets.token_hex(3)}"
    token = recorded_token(live_settings, slurm_account, sub=subject)
    (curls,) = section_blocks("## Teams: members, keys, spend alerts and the audit log", "sh")
    fail_on_http_errors = "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n"
    # Its own members, which other tests of this account must not see: taken out again below.
    undo = f'\ncurl -s -X DELETE "$GPUPOOL_URL/account/members/bob" -H "$H"; curl -s -X DELETE "$GPUPOOL_URL/account/members/{subject}" -H "$H"\n'
    ran = run_block(fail_on_http_errors + curls + undo, ["/bin/bash", "-c"], server, token, tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    member, key, alerts, audit = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")][:4]
    assert (member["subject"], member["role"], member["gpu_limit"], member["monthly_limit"]) == ("bob", "member", 2, "250.00"), member
    assert key["key"].startswith(f"gpk_{key['id']}_") and key["scope"] == "submit", key
    assert alerts["thresholds"] == [50, 80, 100] and alerts["forecast_hours"] == 48, alerts
    assert [(e["action"], e["actor"], e["via"]) for e in audit["events"][:3]] == [
        ("alerts.set", subject, "token"), ("key.create", subject, "token"), ("member.set", subject, "token"),
    ], audit


def test_the_idle_gpus_section_runs_as_written(
    start_server: Callable[..., Server], live_settings: Settings, slurm_account: str, tmp_path: Path
) -> None:
    operator, customer = section_blocks("## Idle GPUs", "sh")
    # The operator's line as the CLI parses it (its run against a database is tests/api/test_idle_gpus.py's).
    (command,) = [line for line in operator.splitlines() if line.startswith("gpupool ")]
    parsed = build_parser().parse_args(shlex.split(command)[1:])
    assert (parsed.account, parsed.window_min, parsed.threshold_pct, parsed.grace_min, parsed.cancel) == ("acme", 30, 5, 15, True)

    server = start_server()
    token = recorded_token(live_settings, slurm_account, sub=f"tour-{secrets.token_hex(3)}")
    fail_on_http_errors = "set -euo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n"
    ran = run_block(fail_on_http_errors + customer, ["/bin/bash", "-c"], server, token, tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (job,) = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert job["template"] == "hello" and set(job["gpu_usage"]) == {"idle_since", "idle_notified_at", "idle_cancelled_at", "gpus"}, job
