"""sbatch that hands the job to slurmctld and then reports an error: the job is tracked, never submitted twice.

The run-as helper of this module runs a Slurm bin folder whose sbatch calls the
real one and then prints what sbatch prints when slurmctld's reply is lost.
"""

from __future__ import annotations

import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from bench.support.tenancy import runas_helper
from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from tests.conftest import bearer, create_app_for_tests, new_uuid, slurm_cmd, wait_for

LOST_REPLY = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"
# Run as the tenant. After the seconds in its folder's delay_s (0: at once) the real sbatch takes
# the job; either way this one then reports the lost reply and exits 1. Each call adds a line to calls.
SBATCH_WRAPPER = f"""#!/bin/bash
here="$(dirname "$0")"
echo "$*" >> "$here/calls"
delay="$(cat "$here/delay_s")"
if [ "$delay" = 0 ]; then
    /usr/bin/sbatch "$@" > /dev/null
else
    # The helper gives the script on standard input, which this one returns before the real sbatch reads it.
    script="$(mktemp)"
    cat > "$script"
    setsid bash -c 'sleep "$0"; exec /usr/bin/sbatch "$@"' "$delay" "$@" < "$script" > /dev/null 2>&1 &
fi
echo "{LOST_REPLY}" >&2
exit 1
"""


@dataclass
class LostReplySlurm:
    bin_dir: Path
    runas_socket: str

    def delay_submission(self, seconds: int) -> None:
        (self.bin_dir / "delay_s").write_text(f"{seconds}\n")

    def sbatch_calls(self) -> int:
        return len((self.bin_dir / "calls").read_text().splitlines())


@pytest.fixture(scope="module")
def lost_reply_slurm(job_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LostReplySlurm]:
    # The tenant runs this sbatch: pytest's own folders are root's alone (0700).
    bin_dir = Path(tempfile.mkdtemp(prefix="gpupool-lost-reply-", dir="/var/tmp"))
    bin_dir.chmod(0o755)
    try:
        sbatch = bin_dir / "sbatch"
        sbatch.write_text(SBATCH_WRAPPER)
        sbatch.chmod(0o755)
        (bin_dir / "scancel").symlink_to("/usr/bin/scancel")
        calls = bin_dir / "calls"
        calls.touch()
        calls.chmod(0o666)  # appended to by every tenant the tests submit as
        (bin_dir / "delay_s").write_text("0\n")
        (bin_dir / "delay_s").chmod(stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
        with runas_helper(job_root, tmp_path_factory.mktemp("lost-reply"), {"GPUPOOL_SLURM_BIN_DIR": str(bin_dir)}) as socket_path:
            yield LostReplySlurm(bin_dir, socket_path)
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)


@pytest.fixture
def lost_reply_client(settings: Settings, session_factory: sessionmaker, lost_reply_slurm: LostReplySlurm) -> FlaskClient:
    """The API as usual (its own squeue and sacct are the real ones), submitting through that helper."""
    lost_settings = settings.replace(runas_socket=lost_reply_slurm.runas_socket)
    return create_app_for_tests(lost_settings, SlurmClient(lost_settings), session_factory).test_client()


def slurm_jobs_tagged(account: str, job_id: str) -> list[int]:
    lines = slurm_cmd("squeue", "-h", "-t", "all", f"--account={account}", "-o", "%i|%k").splitlines()
    return [int(slurm_id) for slurm_id, _, comment in (line.partition("|") for line in lines) if comment == f"gpupool:{job_id}"]


HELLO = {"template": "hello", "gpus": 1, "params": {"seconds": 120}}


def test_a_lost_reply_after_slurm_took_the_job_adopts_it_at_once(
    lost_reply_client: FlaskClient, lost_reply_slurm: LostReplySlurm, settings: Settings, account: str
) -> None:
    lost_reply_slurm.delay_submission(0)
    headers = {**bearer(settings, account), "Idempotency-Key": new_uuid()}
    created = lost_reply_client.post("/submit", headers=headers, json=HELLO)
    assert created.status_code == 201, created.get_json()
    body = created.get_json()
    assert slurm_jobs_tagged(account, body["job_id"]) == [body["slurm_job_id"]]


def test_a_lost_reply_before_slurm_shows_the_job_is_503_with_the_job_and_the_retry_never_submits_twice(
    lost_reply_client: FlaskClient, lost_reply_slurm: LostReplySlurm, settings: Settings, account: str
) -> None:
    lost_reply_slurm.delay_submission(3)  # slurmctld still working through the request when sbatch gives up
    calls_before = lost_reply_slurm.sbatch_calls()
    headers = {**bearer(settings, account), "Idempotency-Key": new_uuid()}
    refused = lost_reply_client.post("/submit", headers=headers, json=HELLO)
    assert refused.status_code == 503
    assert refused.get_json()["error"] == "slurm_unavailable"
    job_id = refused.get_json()["job_id"]
    assert lost_reply_client.get(f"/jobs/{job_id}", headers=headers).get_json()["reason"] == "Submitting"

    # The refresher finds the job by its tag once slurmctld lists it.
    adopted = wait_for(
        lambda: lost_reply_client.get(f"/jobs/{job_id}", headers=headers).get_json()["slurm_job_id"],
        timeout_s=60,
        what="the refresher to adopt the job by its tag",
    )
    retried = lost_reply_client.post("/submit", headers=headers, json=HELLO)
    assert retried.status_code == 201 and retried.headers["Idempotent-Replayed"] == "true"
    assert (retried.get_json()["job_id"], retried.get_json()["slurm_job_id"]) == (job_id, adopted)
    assert slurm_jobs_tagged(account, job_id) == [adopted]
    assert lost_reply_slurm.sbatch_calls() == calls_before + 1
