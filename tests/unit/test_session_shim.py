"""The session shim where the node cannot make a private network for the app, on the real kernel.

A user namespace whose ``user.max_user_namespaces`` is 0 is a node that refuses
unprivileged user namespaces (the sysctl is per user namespace, so this test
changes nothing outside its own): the shim must fail, say why, and never start
the app on the shared loopback.
"""

from __future__ import annotations

import ast
import datetime as dt
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.config import Settings
from gpupool.models.jobs import Job
from gpupool.models.sessions import JobSession
from gpupool.session_shim import NO_PRIVATE_NETWORK_EXIT
from gpupool.sessions import NO_PRIVATE_NETWORK_REASON, session_view

SHIM = Path(__file__).parents[2] / "gpupool" / "session_shim.py"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is missing")
def test_shim_refuses_to_start_the_app_without_a_private_network(tmp_path: Path) -> None:
    started = tmp_path / "app-started"
    (tmp_path / "secret").write_text("s" * 43)
    (tmp_path / "port").touch()
    script = (
        "echo 0 > /proc/sys/user/max_user_namespaces && "
        f'exec "$0" {SHIM} --secret-file {tmp_path / "secret"} --port-file {tmp_path / "port"} --ports 20000-29999 '
        f"-- touch {started}"
    )
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", script, sys.executable],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == NO_PRIVATE_NETWORK_EXIT, (result.returncode, result.stderr)
    assert "cannot give the app a private network" in result.stderr
    assert "user.max_user_namespaces" in result.stderr
    # The app never ran, and the port file says nothing: gpupool never sends anyone there.
    assert not started.exists() and (tmp_path / "port").read_text() == ""


def test_session_view_says_why_a_session_never_started_on_such_a_node() -> None:
    job = Job(id="j-1", finished=True, state="FAILED", exit_code=NO_PRIVATE_NETWORK_EXIT, end_reason=None)
    record = JobSession(job_id="j-1", label="a" * 20, idle_timeout_min=30, port=None)
    view = session_view(Settings(), job, record, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert view["state"] == "ended" and view["end_reason"] == NO_PRIVATE_NETWORK_REASON
    # Any other failure keeps what the job says.
    job.exit_code = 1
    assert session_view(Settings(), job, record, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))["end_reason"] is None


def test_the_shim_is_python_37_syntax() -> None:
    """It runs in whatever Python the job's image has: nothing newer than 3.7's grammar."""
    ast.parse(SHIM.read_text(), feature_version=(3, 7))
