"""A real gunicorn with several workers, on its own committed PostgreSQL database."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpupool import db
from gpupool.models import Account
from tests.conftest import JWT_SECRET, REDIS_URL, REPO, create_database, drop_database

BIN = Path(sys.executable).parent
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "sacctmgr")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any


def http(method: str, url: str, *, token: str | None = None, body: Any = None, headers: dict[str, str] | None = None, timeout_s: float = 30) -> Reply:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw, status, got = response.read(), response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        raw, status, got = exc.read(), exc.code, dict(exc.headers)
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        parsed = raw.decode(errors="replace")
    return Reply(status, got, parsed)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def counting_bin_dir(root: Path) -> tuple[Path, Path]:
    """Wrappers that log each Slurm command run, then run the real one."""
    wrappers, calls = root / "slurm-bin", root / "slurm-calls.log"
    wrappers.mkdir()
    calls.touch()
    for command in SLURM_COMMANDS:
        wrapper = wrappers / command
        wrapper.write_text(f'#!/bin/sh\necho {command} >> "{calls}"\nexec /usr/bin/{command} "$@"\n')
        wrapper.chmod(0o755)
    return wrappers, calls


def slurm_calls(calls: Path, *commands: str) -> int:
    return sum(1 for line in calls.read_text().split() if line in commands)


@pytest.fixture(scope="module")
def live_db(slurm_account: str) -> Iterator[str]:
    name = f"gpupool_live_{secrets.token_hex(4)}"
    url = create_database(name)
    engine = db.make_engine(url)
    with db.make_session_factory(engine)() as session, session.begin():
        session.add(Account(name=slurm_account, gpu_limit=4))
    engine.dispose()
    yield name
    drop_database(name)


@pytest.fixture
def start_server(tmp_path: Path, live_db: str) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(*, workers: int = 4, wait: bool = True, config_file: Path | None = None, **settings: str) -> Server:
        """gunicorn configured by GPUPOOL_* variables, or only by ``config_file`` when given."""
        port = free_port()
        env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
        if config_file is not None:
            env["GPUPOOL_CONFIG"] = str(config_file)
        else:
            env.update(
                {
                    "GPUPOOL_DATABASE_URL": f"postgresql://postgres@127.0.0.1:5432/{live_db}",
                    "GPUPOOL_JWT_SECRET": JWT_SECRET,
                    "GPUPOOL_RATELIMIT_STORAGE_URI": REDIS_URL,
                    "GPUPOOL_TEMPLATES_DIR": str(REPO / "slurm_templates"),
                    "GPUPOOL_JOB_ROOT": str(tmp_path / "jobs"),
                    "GPUPOOL_REFRESH_INTERVAL_S": "1",
                }
            )
        env.update({f"GPUPOOL_{key.upper()}": value for key, value in settings.items()})
        log_path = tmp_path / f"gunicorn-{port}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [str(BIN / "gunicorn"), "--workers", str(workers), "--timeout", "30", "--bind", f"127.0.0.1:{port}", "api:create_app()"],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = Server(f"http://127.0.0.1:{port}", process, log_path, env)
        started.append(server)
        if wait:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    raise AssertionError(f"gunicorn exited {process.returncode}:\n{server.log()}")
                try:
                    if http("GET", server.url + "/healthz", timeout_s=2).status == 200:
                        return server
                except OSError:
                    pass
                time.sleep(0.2)
            raise AssertionError(f"gunicorn did not come up:\n{server.log()}")
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGTERM)
            try:
                server.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.process.pid, signal.SIGKILL)
