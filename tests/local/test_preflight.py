"""`make run`'s preflight (deploy/local/preflight.sh): each problem is one message and exit 1.

Runs the script as `make run` does, on this machine, with the one thing under
test made wrong: a host name that does not resolve (in a UTS namespace of its
own), a port somebody else holds, too little disk.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PREFLIGHT = REPO / "deploy" / "local" / "preflight.sh"


def run_preflight(*wrapper: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", **settings}
    return subprocess.run([*wrapper, str(PREFLIGHT)], env=env, capture_output=True, text=True, timeout=120)


def problems(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The problem lines, without the closing count."""
    return [line for line in result.stderr.splitlines() if line.startswith("preflight:") and "problem(s) found" not in line]


@pytest.fixture()
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture()
def held_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a UTS namespace needs root")
def test_a_host_name_that_does_not_resolve_is_one_message_and_exit_1(free_port: int) -> None:
    name = "gp-preflight-nowhere.invalid"
    result = run_preflight("unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$0"', GPUPOOL_PORT=str(free_port))
    assert result.returncode == 1, result.stderr
    assert problems(result) == [
        f"preflight: this machine's host name '{name}' does not resolve (getent ahosts {name} finds no address), "
        "and Slurm's daemons and sacctmgr reach each other by it. "
        f"Add a line such as '127.0.1.1 {name}' to /etc/hosts, then run make run again."
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="naming another user's listening process needs root")
def test_the_api_port_held_by_another_process_is_named(held_port: int) -> None:
    result = run_preflight(GPUPOOL_PORT=str(held_port))
    assert result.returncode == 1, result.stderr
    [message] = problems(result)
    assert message.startswith(f"preflight: port {held_port}, which the API (gunicorn; set GPUPOOL_PORT to use another) needs, is in use by ")
    assert f"(pid {os.getpid()})" in message, message


def test_too_little_disk_is_one_message_per_file_system(free_port: int) -> None:
    result = run_preflight(GPUPOOL_PORT=str(free_port), GPUPOOL_PREFLIGHT_MIN_FREE_MB=str(2**40))
    assert result.returncode == 1, result.stderr
    found = problems(result)
    assert found, result.stderr
    assert all("MiB free on the file system of" in line and "make run needs about" in line for line in found), found
    assert result.stderr.rstrip().endswith(f"preflight: {len(found)} problem(s) found; nothing was changed.")


@pytest.mark.skipif(os.geteuid() != 0, reason="naming the cluster's daemons needs root")
def test_the_local_clusters_own_daemons_are_not_a_conflict(free_port: int) -> None:
    """A second `make run` finds slurmctld, slurmd, slurmdbd and MariaDB from the first on their ports."""
    result = run_preflight(GPUPOOL_PORT=str(free_port))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("preflight: ok"), result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the check is made for root, whose service user is another uid")
def test_a_checkout_the_service_user_cannot_reach_is_one_message(tmp_path: Path, free_port: int) -> None:
    """Root's clone under /root (mode 0700): found before anything is installed, not at the end."""
    closed = tmp_path / "closed"
    script = closed / "gpupool" / "deploy" / "local" / "preflight.sh"
    script.parent.mkdir(parents=True)
    shutil.copy2(PREFLIGHT, script)
    closed.chmod(0o700)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "GPUPOOL_PORT": str(free_port)}
    result = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert problems(result) == [
        f"preflight: {closed} does not let other users pass (mode 700), so the service user could not run gpupool "
        f"from {closed / 'gpupool'}. Clone gpupool under /opt or /srv instead, or make run as a normal user with sudo."
    ]
