"""A fresh minimal Debian 12 host (deploy/freshhost): the README's first command as a new user runs it.

These tests run with `make test-freshhost` (pytest -m freshhost); a plain
`pytest` skips them: they boot a container with systemd as PID 1 and install
Slurm, MariaDB and the virtualenv into it from the package registries.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOST_SH = REPO / "deploy" / "freshhost" / "host.sh"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "freshhost: boots a fresh minimal Debian 12 host (make test-freshhost)")


@pytest.fixture(autouse=True)
def _only_when_asked(request: pytest.FixtureRequest) -> None:
    if "freshhost" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the fresh-host test runs with `make test-freshhost` (pytest -m freshhost)")
    if os.geteuid() != 0:
        pytest.skip("booting a host in namespaces needs root")


@dataclass(frozen=True)
class FreshHost:
    name: str
    root: Path

    def run(self, script: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`script` in bash as root in the host, with a root login's environment."""
        result = subprocess.run(
            [str(HOST_SH), "exec", self.name, "/bin/bash", "-c", script],
            capture_output=True, text=True, timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"in {self.name}: {script!r} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def popen(self, script: str, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(
                [str(HOST_SH), "exec", self.name, "/bin/bash", "-c", script],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )


def checkout_files() -> list[str]:
    """This checkout as a fresh clone of it would have it: tracked and new files, not ignored ones."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split("\0")
    return [name for name in listed if name and (REPO / name).is_file()]


@pytest.fixture()
def fresh_host() -> Iterator[FreshHost]:
    """Booted from the cached image with nothing of an earlier run; removed afterwards, whatever the result."""
    name = f"fh-{uuid.uuid4().hex[:6]}"
    try:
        up = subprocess.run([str(HOST_SH), "up", name], capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, f"host.sh up {name}:\n{up.stdout}\n{up.stderr}"
        yield FreshHost(name=name, root=Path(up.stdout.strip().splitlines()[-1]))
    finally:
        subprocess.run([str(HOST_SH), "down", name], capture_output=True, text=True, timeout=300)
