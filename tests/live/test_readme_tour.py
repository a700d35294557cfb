"""The README's five-minute tour, run as written against a real server and the real cluster.

The README is the first thing a newcomer runs; its commands must keep working.
Each block runs in bash (curl made to fail on an HTTP error) or Python with only
GPUPOOL_URL and GPUPOOL_TOKEN set, as `make run`'s export leaves them.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.config import Settings
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
