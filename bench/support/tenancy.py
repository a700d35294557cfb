"""The multi-tenant set-up the tests share with the benches: service user, job root, run-as helper.

Tests run as root, as CI does. The API they start in-process runs as root too,
but it still submits through a real run-as helper over its socket; the
hostile-tenant suite and the live servers run gunicorn as the unprivileged
service user, as production does.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from gpupool.config import Settings
from gpupool.proc import run_command

SERVICE_USER = "gpupool"
TENANT_PREFIX = Settings.tenant_user_prefix
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def ensure_service_user() -> pwd.struct_passwd:
    """The service user the playbook creates; made here too, so the tests stand alone."""
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        run_command(
            ["/usr/sbin/useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
             "--shell", "/usr/sbin/nologin", SERVICE_USER],
            timeout_s=30,
        )
        return pwd.getpwnam(SERVICE_USER)


@contextmanager
def root_for_tests(prefix: str = "gpupool-jobs-") -> Iterator[Path]:
    """A job or storage root tenants can pass through: pytest's own temporary folders are root's alone (0700)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    root.chmod(0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def job_root_for_tests() -> AbstractContextManager[Path]:
    return root_for_tests("gpupool-jobs-")


def helper_environment(job_root: Path, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": "/root",
        "GPUPOOL_JOB_ROOT": str(job_root),
        "GPUPOOL_SERVICE_USER": SERVICE_USER,
        "GPUPOOL_SERVICE_GROUP": SERVICE_USER,
        **(extra_env or {}),
    }


@contextmanager
def runas_helper(job_root: Path, log_dir: Path, extra_env: Mapping[str, str] | None = None) -> Iterator[str]:
    """``gpupool runas serve`` as root on a fresh socket, with ``extra_env`` settings; yields the socket path."""
    ensure_service_user()
    socket_path = Path(tempfile.mkdtemp(prefix="gpupool-runas-", dir="/run" if os.access("/run", os.W_OK) else None))
    socket_file = str(socket_path / f"runas-{secrets.token_hex(3)}.sock")
    log_path = log_dir / "runas.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(BIN / "gpupool"), "runas", "serve", "--socket", socket_file],
            cwd=REPO,
            env=helper_environment(job_root, extra_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the run-as helper exited {process.returncode}:\n{log_path.read_text()}")
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(socket_file)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the run-as helper did not listen:\n{log_path.read_text()}") from None
                time.sleep(0.1)
        yield socket_file
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)
        shutil.rmtree(socket_path, ignore_errors=True)


def sbatch_as_tenant(account: str, *options: str, wrap: str) -> int:
    """A job the account's tenant user submits itself with plain sbatch, as a customer with a shell would."""
    completed = run_command(
        ["/usr/sbin/runuser", "-u", TENANT_PREFIX + account, "--", "sbatch", "--parsable", f"--account={account}",
         "--partition=gpu", "--time=5", "--chdir=/tmp", "--output=/dev/null", *options, f"--wrap={wrap}"],
        timeout_s=30,
        env={"PATH": "/usr/bin:/bin", "TZ": "UTC", "LANG": "C.UTF-8"},
    )
    return int(completed.stdout.strip().split(";")[0])
