"""The service reads a job's logs and nothing else the job writes, as production runs it.

gunicorn runs as the unprivileged service user and serves the logs; the
kernel, asked as that same user, refuses the job's other files and the
folder's listing, and refuses another tenant everything.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.support.http import as_service_user_argv
from bench.support.services import TENANT_PREFIX
from bench.support.tenancy import SERVICE_USER
from gpupool.config import Settings
from gpupool.proc import CommandResult, run_command
from tests.conftest import recorded_token, wait_for
from tests.live.conftest import Server, http

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SHELL_TEMPLATE = (
    'description = "Run the script given as a parameter."\n[params.script]\ntype = "string"\nmax_length = 2000\n',
    'bash -c "$GPUPOOL_PARAM_SCRIPT"\n',
)
# What a customer's job keeps in its own folder: data, a subfolder, nothing chmod-ed.
JOB_SCRIPT = """echo shown-on-stdout
echo shown-on-stderr >&2
echo tenant-secret > "$GPUPOOL_JOB_DIR/secret.txt"
mkdir "$GPUPOOL_JOB_DIR/data"
echo tenant-checkpoint > "$GPUPOOL_JOB_DIR/data/checkpoint.bin"
"""


@pytest.fixture(scope="module")
def templates_dir() -> Iterator[Path]:
    """A template the service user can read (pytest's own folders are root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="gpupool-templates-", dir="/var/tmp"))
    root.chmod(0o755)
    (root / "shell").mkdir(mode=0o755)
    (root / "shell" / "template.toml").write_text(SHELL_TEMPLATE[0])
    (root / "shell" / "run.sh").write_text(SHELL_TEMPLATE[1])
    for path in (root / "shell").iterdir():
        path.chmod(0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def as_user(argv_prefix: list[str], *argv: str) -> CommandResult:
    return run_command([*argv_prefix, *argv], timeout_s=30, check=False, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})


def assert_refused(result: CommandResult) -> None:
    assert result.returncode != 0 and "Permission denied" in result.stderr, (result.argv, result.stdout, result.stderr)


def test_the_service_reads_a_jobs_logs_and_nothing_else_it_writes(
    start_server: Callable[..., Server],
    live_settings: Settings,
    slurm_account: str,
    tenant_b: str,
    templates_dir: Path,
    job_root: Path,
) -> None:
    tenant = pwd.getpwnam(TENANT_PREFIX + slurm_account)
    service_gid = grp.getgrnam(SERVICE_USER).gr_gid
    # The account's folder as an earlier release made it: the next submit must make it root's 0711.
    account_dir = job_root / slurm_account
    account_dir.mkdir(exist_ok=True)
    os.chown(account_dir, tenant.pw_uid, service_gid)
    os.chmod(account_dir, 0o2750)
    server = start_server(as_service=True, templates_dir=str(templates_dir))
    token = recorded_token(live_settings, slurm_account, sub=f"p-{secrets.token_hex(3)}")
    reply = http("POST", server.url + "/submit", token=token, body={"template": "shell", "gpus": 1, "params": {"script": JOB_SCRIPT}})
    assert reply.status == 201, reply.body
    job_id = reply.body["job_id"]
    wait_for(
        lambda: http("GET", f"{server.url}/jobs/{job_id}", token=token).body["state"] == "COMPLETED",
        timeout_s=120,
        what="the job to finish",
    )

    # The API, running as the service user, serves both logs.
    for stream, text in (("stdout", "shown-on-stdout"), ("stderr", "shown-on-stderr")):
        served = http("GET", f"{server.url}/jobs/{job_id}/logs?stream={stream}", token=token)
        assert served.status == 200 and text in served.body, (stream, served.body)

    job_dir = account_dir / job_id
    service = as_service_user_argv()
    # The kernel, asked as the service user: the logs yes; the job's own files and the listings no.
    assert "shown-on-stdout" in as_user(service, "cat", str(job_dir / "stdout.log")).stdout
    for argv in (
        ("cat", str(job_dir / "secret.txt")),
        ("cat", str(job_dir / "data" / "checkpoint.bin")),
        ("ls", str(job_dir / "data")),
        ("ls", str(job_dir)),
        ("ls", str(account_dir)),
    ):
        assert_refused(as_user(service, *argv))

    # Another tenant gets nothing at all, logs included.
    other = ["/usr/sbin/runuser", "-u", TENANT_PREFIX + tenant_b, "--"]
    for argv in (
        ("cat", str(job_dir / "stdout.log")),
        ("cat", str(job_dir / "secret.txt")),
        ("ls", str(job_dir)),
        ("ls", str(account_dir)),
    ):
        assert_refused(as_user(other, *argv))

    # Why: the job's folder 0710 with no set-group-id, the helper's logs the service's group, the rest the tenant's own;
    # the account's folder root's, 0711, taken back from the tenant an earlier release gave it to.
    info = os.stat(job_dir)
    assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o710, service_gid)
    info = os.stat(account_dir)
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o711, 0, 0)
    for name in ("stdout.log", "stderr.log", "job.sbatch"):
        info = os.stat(job_dir / name)
        assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o640, service_gid), name
    for path in (job_dir / "secret.txt", job_dir / "data", job_dir / "data" / "checkpoint.bin"):
        info = os.stat(path)
        assert info.st_gid == tenant.pw_gid and stat.S_IMODE(info.st_mode) & 0o077 == 0, (path, oct(info.st_mode))
