"""A tenant's job cannot leave processes behind it: Slurm ends them with the job.

A job's code may start a process in a session of its own (``setsid``, as any
daemon does). Under ``proctrack/linuxproc`` Slurm lost such a process when the
job's script ended: it ran on after sacct said the job was COMPLETED, for no
money and past any time limit. With ``proctrack/cgroup`` (the playbook's rule
wherever tenants run, inventories/local included) the process stays in the
job's cgroup, and Slurm ends it before it reports the job ended. The job here is
the account's own ``sbatch``, as a customer's shell would run it; the test
reads the kernel's answer (``/proc``), sacct's and the invoice's.
"""

from __future__ import annotations

import csv
import io
import os
import pwd
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.support.services import TENANT_PREFIX
from bench.support.tenancy import sbatch_as_tenant
from billing.calendar import period_of
from gpupool.errors import CommandFailed
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import gpus_by_type, parse_delimited, parse_time
from tests.billing.conftest import LedgerDb, pg_ledger  # noqa: F401 (pg_ledger: a fixture)
from tests.conftest import slurm_cmd, throwaway_slurm_account, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def live_processes(marker: str) -> list[int]:
    """Processes whose command line starts with ``marker``; a dead one waiting for its parent has none."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:  # it ended while we looked
            continue
        if argv0 == marker.encode():
            found.append(int(entry.name))
    return found


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, session, ...]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def ended_in_sacct(job_id: int) -> dict[str, str] | None:
    try:
        rows = parse_delimited(slurm_cmd("sacct", "-X", "-P", "-j", str(job_id), "-o", "JobIDRaw,State,Start,End,ElapsedRaw,AllocTRES"))
    except CommandFailed:  # slurmdbd busy
        return None
    row = next((r for r in rows if r["JobIDRaw"] == str(job_id)), None)
    # slurmdbd may know the final state before it knows the end time.
    return row if row and row["State"] not in ("PENDING", "RUNNING", "COMPLETING") and row["End"] != "Unknown" else None


@pytest.fixture(scope="module")
def account(pg_ledger: LedgerDb, slurm: SlurmClient) -> Iterator[str]:  # noqa: F811
    with throwaway_slurm_account(slurm, "conf") as name:
        pg_ledger.add_account(name)
        yield name


@pytest.fixture
def signal_folder() -> Iterator[Path]:
    """Where the test tells the job to end: a folder the tenant may look into but not write."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-confinement-", dir="/var/tmp"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_setsid_process_ends_with_its_job_and_the_job_is_billed_as_sacct_recorded_it(
    pg_ledger: LedgerDb, account: str, signal_folder: Path,  # noqa: F811
) -> None:
    marker = f"gpupool-escape-{secrets.token_hex(6)}"
    go = signal_folder / "go"
    # The escapee: a session of its own, no terminal, its output nowhere, as a daemon starts.
    script = (
        f"setsid bash -c 'exec -a \"$0\" sleep 3600' {marker} </dev/null >/dev/null 2>&1 & "
        f"while [ ! -e {go} ]; do sleep 0.2; done"
    )
    job_id = sbatch_as_tenant(account, "--gres=gpu:1", wrap=script)
    try:
        escapee = wait_for(lambda: live_processes(marker), timeout_s=120, what=f"job {job_id}'s setsid'd process")[0]
        _state, _parent, _group, session = stat_fields(escapee)[:4]
        assert int(session) == escapee, "the process leads a session of its own, apart from the job script's"
        assert os.stat(f"/proc/{escapee}").st_uid == pwd.getpwnam(TENANT_PREFIX + account).pw_uid
        # Where Slurm keeps it: the job's cgroup (proctrack/cgroup; linuxproc has none).
        assert f"/job_{job_id}/" in Path(f"/proc/{escapee}/cgroup").read_text(), "the job's processes are not confined"

        go.touch()  # the job script ends; the escapee would sleep on for an hour
        run = wait_for(lambda: ended_in_sacct(job_id), timeout_s=120, what=f"job {job_id} to end in sacct")
        assert run["State"] == "COMPLETED"
        # Ended with the job: by the time sacct has its end, the kernel has no such process alive
        # (a killed one its parent has not reaped yet is a zombie, with no command line).
        assert live_processes(marker) == []
    finally:
        slurm_cmd("scancel", str(job_id), check=False)
        for pid in live_processes(marker):  # only where confinement failed: not to leave it to the machine
            os.kill(pid, 9)

    # The job was billed for what sacct recorded, to the second: 1 GPU x ElapsedRaw.
    elapsed = int(run["ElapsedRaw"])
    start, end = parse_time(run["Start"]), parse_time(run["End"])
    assert start is not None and end is not None and sum(gpus_by_type(run["AllocTRES"]).values()) == 1
    periods = sorted({period_of(start), period_of(end)})  # a run across a month's end is on two invoices
    seen: dict[str, object] = {}

    def billed() -> list[dict[str, str]] | None:
        billing = pg_ledger.cli("billing", "run")
        assert billing.returncode == 0, billing.stderr
        lines = []
        for period in periods:
            invoice = pg_ledger.cli("invoice", "--account", account, "--period", period, "-o", "-")
            assert invoice.returncode == 0, invoice.stderr
            lines += [line for line in csv.DictReader(io.StringIO(invoice.stdout)) if line["slurm_job_id"] == str(job_id)]
        seen.update(lines=lines, billing=billing.stdout + billing.stderr)
        # Billed to its end (a pass just after a job's end may not have it yet).
        return lines if lines and lines[-1]["end"] == run["End"] + "Z" else None

    try:
        lines = wait_for(billed, timeout_s=120, interval_s=2, what=f"job {job_id} billed to its end")
    except AssertionError as timeout:
        raise AssertionError(f"{timeout}\nsacct: {run}\ninvoice lines: {seen.get('lines')}\nlast pass: {seen.get('billing')}"
                             f"\nledger: {pg_ledger.ledger(account)}") from None
    assert lines[0]["start"] == run["Start"] + "Z"
    assert sum(int(line["billed_seconds"]) for line in lines) == elapsed
    assert sum(int(line["gpu_seconds"]) for line in lines) == elapsed
