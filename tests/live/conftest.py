"""A real gunicorn with several workers, on its own committed PostgreSQL database."""

from __future__ import annotations

import os
import pwd
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.support.http import as_service_user_argv, free_port, http
from bench.support.services import TENANT_PREFIX, create_database, drop_database
from gpupool import db
from gpupool.config import Settings
from gpupool.models import Account
from gpupool.slurm.client import SlurmClient
from tests.conftest import JWT_SECRET, REDIS_URL, REPO, base_settings, throwaway_slurm_account

BIN = Path(sys.executable).parent


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def live_db(slurm_account: str) -> Iterator[str]:
    name = f"gpupool_live_{secrets.token_hex(4)}"
    url = create_database(name)
    engine = db.make_engine(url)
    with db.make_session_factory(engine)() as session, session.begin():
        user = TENANT_PREFIX + slurm_account
        session.add(Account(name=slurm_account, gpu_limit=4, unix_user=user, unix_uid=pwd.getpwnam(user).pw_uid))
    engine.dispose()
    yield name
    drop_database(name)


def launch_gunicorn(log_dir: Path, env: dict[str, str], *, workers: int = 4, as_service: bool = False, wait: bool = True,
                    extra_args: tuple[str, ...] = ()) -> Server:
    """gunicorn on a free port with ``env`` (and as the service user under no_new_privs when ``as_service``)."""
    port = free_port()
    log_path = log_dir / f"gunicorn-{port}.log"
    with open(log_path, "wb") as log:
        as_user = as_service_user_argv() if as_service else []
        process = subprocess.Popen(
            [*as_user, str(BIN / "gunicorn"), "--workers", str(workers), "--timeout", "30", *extra_args,
             "--bind", f"127.0.0.1:{port}", "api:create_app()"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", process, log_path, env)
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


def stop_gunicorn(server: Server) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)


def live_env(live_db: str, job_root: Path, runas_socket: str) -> dict[str, str]:
    """The settings of a live server on the module's database, as GPUPOOL_* variables."""
    return {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "GPUPOOL_DATABASE_URL": f"postgresql://postgres@127.0.0.1:5432/{live_db}",
        "GPUPOOL_JWT_SECRET": JWT_SECRET,
        "GPUPOOL_RATELIMIT_STORAGE_URI": REDIS_URL,
        "GPUPOOL_TEMPLATES_DIR": str(REPO / "slurm_templates"),
        "GPUPOOL_JOB_ROOT": str(job_root),
        "GPUPOOL_RUNAS_SOCKET": runas_socket,
        "GPUPOOL_REFRESH_INTERVAL_S": "1",
    }


@pytest.fixture
def start_server(tmp_path: Path, live_db: str, job_root: Path, runas_socket: str) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(
        *, workers: int = 4, wait: bool = True, config_file: Path | None = None, as_service: bool = False,
        gunicorn_args: tuple[str, ...] = (), **settings: str,
    ) -> Server:
        """gunicorn configured by GPUPOOL_* variables, or only by ``config_file`` when given.

        ``as_service`` runs it as the unprivileged service user under no_new_privs,
        as the playbook's systemd unit does (NoNewPrivileges=yes); ``gunicorn_args``
        are gunicorn's own options.
        """
        if config_file is not None:
            env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "GPUPOOL_CONFIG": str(config_file)}
        else:
            env = live_env(live_db, job_root, runas_socket)
        env.update({f"GPUPOOL_{key.upper()}": value for key, value in settings.items()})
        server = launch_gunicorn(tmp_path, env, workers=workers, as_service=as_service, wait=wait, extra_args=gunicorn_args)
        started.append(server)
        return server

    yield start
    for server in started:
        stop_gunicorn(server)


@pytest.fixture(scope="module")
def tenant_b(slurm: SlurmClient, live_db: str) -> Iterator[str]:
    """A second account of the module's own, with its tenant user, in the live database."""
    with throwaway_slurm_account(slurm, "b") as name:
        engine = db.make_engine(f"postgresql://postgres@127.0.0.1:5432/{live_db}")
        user = TENANT_PREFIX + name
        with db.make_session_factory(engine)() as session, session.begin():
            session.add(Account(name=name, gpu_limit=4, unix_user=user, unix_uid=pwd.getpwnam(user).pw_uid))
        engine.dispose()
        yield name


@pytest.fixture
def live_settings(live_db: str) -> Settings:
    return base_settings(database_url=f"postgresql://postgres@127.0.0.1:5432/{live_db}")
