"""Real hosts (deploy/realhosts): the production site.yml on three fresh Debian 12 servers (four with REALHOSTS_HA=1).

These tests run with `make test-realhosts` (pytest -m realhosts); a plain
`pytest` skips them: they boot three systemd containers on a private link and
provision them over SSH from the package registries. One boot for the whole
session: test_site_on_real_hosts.py converges the servers and checks one site,
test_site_without_one_host.py (after it, by name) then takes hosts away from the same servers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
HOSTS_SH = REPO / "deploy" / "realhosts" / "hosts.sh"
ANSIBLE_DIR = REPO / "deploy" / "ansible"
INVENTORY = ANSIBLE_DIR / "inventories" / "realhosts"
# REALHOSTS_HA=1 (`make test-realhosts-ha`): the several-hosts shape of issue 36, a second head node
# (API, database member under Patroni, backup slurmctld; inventories/realhosts-ha, the same group_vars),
# and test_site_without_one_host.py on the same boot. Not in .ci/run yet: it doubles the tier's time.
HA = os.environ.get("REALHOSTS_HA") == "1"
SITE_INVENTORY = ANSIBLE_DIR / "inventories" / ("realhosts-ha" if HA else "realhosts")
BASE_DIR = Path(os.environ.get("REALHOSTS_BASE_DIR", "/var/tmp/gpupool-realhosts"))
LOG_DIR = Path(os.environ.get("REALHOSTS_LOG_DIR", REPO / "var" / "realhosts"))

# name: address, as in inventories/realhosts/hosts.yml.
SERVERS = {"head": "10.50.0.10", **({"head2": "10.50.0.11"} if HA else {}), "gpu01": "10.50.0.21", "gpu02": "10.50.0.22"}
# REALHOSTS_REUSE=1, for working on a later test: the servers a run left up (REALHOSTS_KEEP=1),
# neither cleaned nor booted, their first run's log taken as the first run; left up afterwards.
REUSE = os.environ.get("REALHOSTS_REUSE") == "1"
BOOT_TIMEOUT_S = 600
PLAYBOOK_TIMEOUT_S = 1800

RECAP_LINE = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "realhosts: boots three (four with REALHOSTS_HA=1) systemd containers and runs site.yml on them (make test-realhosts)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip at collection, not in a fixture: the module-scoped cluster would boot before any function fixture ran."""
    if "realhosts" not in (config.getoption("markexpr") or ""):
        reason = "the real-hosts tier runs with `make test-realhosts` (pytest -m realhosts)"
    elif os.geteuid() != 0:
        reason = "booting servers in namespaces on a bridge needs root"
    else:
        return
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@dataclass(frozen=True)
class Server:
    name: str
    address: str

    def run(self, script: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`script` in bash as root on the server, over SSH as its admin account."""
        result = subprocess.run(
            [str(HOSTS_SH), "ssh", self.name, "sudo", "-n", "bash", "-s"],
            input=f"set -euo pipefail\n{script}\n", capture_output=True, text=True, timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"on {self.name}: {script!r} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def out(self, script: str, timeout: float = 180) -> str:
        return self.run(script, timeout=timeout).stdout.strip()


@dataclass(frozen=True)
class PlaybookRun:
    returncode: int
    output: str
    log: Path
    recap: dict[str, dict[str, int]] = field(default_factory=dict)

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP's counts per host (ok, changed, unreachable, failed, ...)."""
    recap: dict[str, dict[str, int]] = {}
    in_recap = False
    for line in output.splitlines():
        if line.startswith("PLAY RECAP"):
            in_recap, recap = True, {}
            continue
        match = RECAP_LINE.match(line.strip()) if in_recap else None
        if match:
            recap[match["host"]] = {key: int(value) for key, value in
                                    (pair.split("=") for pair in match["counts"].split())}
    return recap


@dataclass(frozen=True)
class RunningPlaybook:
    process: subprocess.Popen[bytes]
    log: Path
    label: str
    started: float

    def poll(self) -> int | None:
        return self.process.poll()


@dataclass
class Cluster:
    servers: dict[str, Server]
    runs: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def head(self) -> Server:
        return self.servers["head"]

    def playbook_start(self, *args: str, inventories: Sequence[Path] = (SITE_INVENTORY,),
                       label: str = "run") -> RunningPlaybook:
        """site.yml from this machine over SSH, as an operator runs it (ansible-core from .venv)."""
        self.runs += 1
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log = LOG_DIR / f"{self.runs:02d}-{label}.log"
        command = [str(REPO / ".venv" / "bin" / "ansible-playbook")]
        for inventory in inventories:
            command += ["-i", str(inventory)]
        command += [str(ANSIBLE_DIR / "site.yml"), *args]
        env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
        env.update(ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   REALHOSTS_BASE_DIR=str(BASE_DIR))
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        return RunningPlaybook(process=process, log=log, label=label, started=time.monotonic())

    def playbook_finish(self, running: RunningPlaybook, timeout: float = PLAYBOOK_TIMEOUT_S) -> PlaybookRun:
        try:
            returncode = running.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            running.process.kill()
            returncode = running.process.wait()
        self.timings[running.label] = time.monotonic() - running.started
        output = running.log.read_text()
        return PlaybookRun(returncode=returncode, output=output, log=running.log, recap=parse_recap(output))

    def playbook(self, *args: str, inventories: Sequence[Path] = (SITE_INVENTORY,), label: str = "run",
                 timeout: float = PLAYBOOK_TIMEOUT_S) -> PlaybookRun:
        return self.playbook_finish(self.playbook_start(*args, inventories=inventories, label=label), timeout)


def hosts(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HOSTS_SH), *args], capture_output=True, text=True, timeout=timeout)


def boot(servers: dict[str, str]) -> dict[str, Server]:
    """Boot the servers together (each from the image, fresh), then wait for SSH on each."""
    for name, address in servers.items():
        started = hosts("boot", name, address, timeout=BOOT_TIMEOUT_S)
        assert started.returncode == 0, f"hosts.sh boot {name}:\n{started.stdout}\n{started.stderr}"
    waits = {name: subprocess.Popen([str(HOSTS_SH), "wait", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True) for name in servers}
    for name, wait in waits.items():
        output, _ = wait.communicate(timeout=BOOT_TIMEOUT_S)
        assert wait.returncode == 0, f"hosts.sh wait {name}:\n{output}"
    return {name: Server(name=name, address=address) for name, address in servers.items()}


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """Fresh servers for the session (with REALHOSTS_HA=1 both modules share the boot), removed afterwards
    whatever the result (and anything an earlier run left)."""
    if REUSE:
        yield Cluster(servers={name: Server(name=name, address=address) for name, address in SERVERS.items()},
                      runs=len(list(LOG_DIR.glob("*.log"))))
        return
    hosts("clean")
    started = time.monotonic()
    try:
        real = Cluster(servers=boot(SERVERS))
        real.timings["boot"] = time.monotonic() - started
        yield real
        print(f"\nrealhosts timings (s): {', '.join(f'{k} {v:.0f}' for k, v in real.timings.items())}")
    finally:
        # REALHOSTS_KEEP=1 leaves them up to look into; `hosts.sh clean` removes them.
        if os.environ.get("REALHOSTS_KEEP") != "1":
            hosts("clean")


@pytest.fixture(scope="session")
def first_run(cluster: Cluster) -> PlaybookRun:
    """site.yml's first run on the fresh servers (both modules start from it)."""
    if REUSE:
        output = (LOG_DIR / "01-first.log").read_text()
        return PlaybookRun(returncode=0, output=output, log=LOG_DIR / "01-first.log", recap=parse_recap(output))
    return cluster.playbook(label="first")


def curl_api(base: str, token: str, method: str, path: str, body: dict[str, Any] | None = None,
             max_time_s: float = 60) -> tuple[int, str, str]:
    """The customer's side: curl from this machine (the servers' self-signed certificates).

    (HTTP code, body, curl's stderr); code 0 when no HTTP answer came (refused, cut, timed out).
    """
    command = ["curl", "-sS", "-k", "--max-time", str(max_time_s), "-o", "-", "-w", "\n%{http_code}", "-X", method,
               "-H", f"Authorization: Bearer {token}", f"{base}{path}"]
    if body is not None:
        command += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=max_time_s + 30)
    text, _, code = result.stdout.rpartition("\n")
    return (int(code) if code.strip().isdigit() else 0), text, result.stderr
