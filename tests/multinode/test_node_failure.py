"""A compute node dies under a running job: Slurm, the API, billing and the playbook's answers."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import pwd
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from api import create_app
from bench.support.services import run_seconds, start_requeued_now
from gpupool.clock import FrozenClock
from gpupool.config import Settings
from gpupool.models import Account
from gpupool.slurm.client import SlurmClient
from tests.billing.conftest import RTX3090_NANOS, RTX4090_NANOS, LedgerDb, _prepare
from tests.conftest import SUITE_NOW, bearer, create_database, drop_database, wait_for, wait_for_state
from tests.multinode.conftest import (
    GPU2_NODE,
    GPU4_NODE,
    MULTINODE_SLURM_CONF,
    mn_cmd,
    multinode_account,
    namespace_pids,
    node_line,
    node_state,
    run_multinode_playbook,
    sacct_runs,
)

pytestmark = [pytest.mark.multinode, pytest.mark.slow]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory, session_settings: Settings) -> Iterator[LedgerDb]:
    """A database of its own, shared by the API and the billing passes (`gpupool billing run`)."""
    name = f"gpupool_mnbill_{secrets.token_hex(4)}"
    prepared = _prepare(create_database(name), tmp_path_factory.mktemp("archive"))
    prepared.settings = session_settings.replace(
        database_url=prepared.url, billing_archive_dir=prepared.settings.billing_archive_dir
    )
    yield prepared
    prepared.engine.dispose()
    drop_database(name)


@pytest.fixture(scope="module")
def billed_account(ledger: LedgerDb) -> Iterator[str]:
    with multinode_account(SlurmClient(ledger.settings), "nf") as name:
        user = f"gp-{name}"
        with ledger.sessions() as session, session.begin():
            session.add(Account(name=name, gpu_limit=8, unix_user=user, unix_uid=pwd.getpwnam(user).pw_uid))
        yield name


def kill_node(node: str) -> None:
    """What a power cut does to a node: its slurmd and every process of its namespace die at once."""
    pids = namespace_pids(node)
    assert pids, f"nothing runs on {node}"
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not namespace_pids(node), timeout_s=30, what=f"{node}'s processes to be gone")


def test_a_job_on_a_node_that_dies_ends_node_fail_is_credited_and_the_node_comes_back(
    ledger: LedgerDb, billed_account: str
) -> None:
    app = create_app(ledger.settings.replace(refresh_interval_s=1.0), session_factory=ledger.sessions, clock=FrozenClock(SUITE_NOW))
    client = app.test_client()
    headers = bearer(ledger.settings, billed_account)
    created = client.post(
        "/submit", headers=headers, json={"template": "hello", "gpus": 2, "gpu_type": "rtx3090", "params": {"seconds": 600}}
    )
    assert created.status_code == 201, created.get_json()
    job = created.get_json()
    running = wait_for_state(client, job["job_id"], headers, {"RUNNING"}, timeout_s=120)
    assert running["node"] == GPU2_NODE
    wait_for(lambda: sacct_runs(job["slurm_job_id"])[0]["State"] == "RUNNING", timeout_s=60, what="sacct to see it run")
    # Billed while it runs, as the timer's passes would.
    assert ledger.cli("billing", "run", SLURM_CONF=MULTINODE_SLURM_CONF).returncode == 0

    kill_node(GPU2_NODE)

    # slurmctld stops hearing from the node (SlurmdTimeout), marks it DOWN and fails its job;
    # the partition does not requeue (JobRequeue=0), so the job ends there.
    failed = wait_for_state(client, job["job_id"], headers, {"NODE_FAIL"}, timeout_s=180)
    assert failed["node"] == GPU2_NODE
    (run,) = wait_for(
        lambda: [r for r in sacct_runs(job["slurm_job_id"]) if r["State"] == "NODE_FAIL" and r["End"] != "Unknown"],
        timeout_s=60, what="sacct to record NODE_FAIL",
    )
    assert "gres/gpu:rtx3090=2" in run["AllocTRES"].split(",")
    # Slurm took the node out itself: not responding ("*"), with that reason. sinfo shows it
    # "down*" once the failed job's allocation is gone, and may show "mixed*" a while before.
    wait_for(lambda: node_state(GPU2_NODE).endswith("*") and "Reason=Not responding" in node_line(GPU2_NODE),
             timeout_s=120, what=f"{GPU2_NODE} out of service, not responding")

    # The next billing pass charges the run's last seconds and credits all of it back.
    billing = ledger.cli("billing", "run", SLURM_CONF=MULTINODE_SLURM_CONF)
    assert billing.returncode == 0, billing.stderr
    charged = sum(row[16] for row in ledger.ledger(billed_account) if row[2] == str(job["slurm_job_id"]))
    assert charged == 2 * int(run["ElapsedRaw"]) * RTX3090_NANOS
    period = f"{dt.datetime.now(dt.UTC):%Y-%m}"
    invoice = ledger.cli("invoice", "--account", billed_account, "--period", period, "-o", "-")
    assert invoice.returncode == 0, invoice.stderr
    lines = list(csv.DictReader(io.StringIO(invoice.stdout)))
    credits = [line for line in lines if line["line_type"] == "adjustment"]
    assert len(credits) == 1
    assert f"automatic credit: job {job['slurm_job_id']} ended in NODE_FAIL" in str(credits[0])
    job_cents = sum(round(float(line["amount"]) * 100) for line in lines if line["line_type"] == "job")
    assert round(float(credits[0]["amount"]) * 100) == -job_cents
    assert round(float(lines[-1]["amount"]) * 100) == 0  # the total: nothing owed for the lost run
    again = ledger.cli("billing", "run", SLURM_CONF=MULTINODE_SLURM_CONF)
    assert again.returncode == 0
    assert len([line for line in csv.DictReader(io.StringIO(ledger.cli(
        "invoice", "--account", billed_account, "--period", period, "-o", "-").stdout)) if line["line_type"] == "adjustment"]) == 1

    # The playbook starts the node's slurmd again; Slurm took the node out itself (not
    # responding), so it returns to service and takes jobs (an operator's drain would stay).
    run_multinode_playbook()
    assert node_state(GPU2_NODE) == "idle"
    after = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 2, "gpu_type": "rtx3090"})
    assert after.status_code == 201
    done = wait_for_state(client, after.get_json()["job_id"], headers, {"COMPLETED", "FAILED"}, timeout_s=120)
    assert done["state"] == "COMPLETED" and done["node"] == GPU2_NODE


# The GPU check as the playbook installs it on a GPU node (slurm_compute); the multinode playbook leaves
# HealthCheckProgram off (its launcher's path is the local cluster's), so the test runs it in the node's namespace.
GPU_CHECK = Path("/usr/local/sbin/gpupool-gpu-check")
GPU_PRICES = {GPU4_NODE: RTX4090_NANOS, GPU2_NODE: RTX3090_NANOS}


def run_gpu_check(node: str, folder: Path, slurm_wrappers: Path) -> str:
    """One run of gpupool-gpu-check on ``node``, as slurmd would start it there (its name, its gres.conf)."""
    config = folder / "gpu-check.json"
    config.write_text(json.dumps({
        "node_name": node, "gres_conf": f"/etc/gpupool-multinode/{node}/slurm/gres.conf",
        "nvidia_smi": str(folder / "no-nvidia-smi"), "state_dir": str(folder / "state"),
        "scontrol": str(slurm_wrappers / "scontrol"), "squeue": str(slurm_wrappers / "squeue"),
        "scancel": str(slurm_wrappers / "scancel"),
    }))
    result = subprocess.run(["ip", "netns", "exec", node, str(GPU_CHECK), "--config", str(config)],
                            capture_output=True, text=True, timeout=60)
    return result.stdout + result.stderr


def test_a_job_that_asked_for_requeue_leaves_a_failed_gpu_completes_on_the_other_node_and_only_that_run_is_paid(
    ledger: LedgerDb, billed_account: str, slurm_wrappers: Path, tmp_path: Path,
) -> None:
    if not GPU_CHECK.exists():
        pytest.skip(f"{GPU_CHECK} is missing: the local cluster predates the GPU check (make cluster)")
    app = create_app(ledger.settings.replace(refresh_interval_s=1.0), session_factory=ledger.sessions, clock=FrozenClock(SUITE_NOW))
    client = app.test_client()
    headers = bearer(ledger.settings, billed_account)
    # Two GPUs of any type: either node can run it; 40 s on the node it finishes on.
    created = client.post("/submit", headers=headers, json={
        "template": "hello", "gpus": 2, "requeue_on_failure": True, "params": {"seconds": 40},
    })
    assert created.status_code == 201, created.get_json()
    job = created.get_json()
    running = wait_for_state(client, job["job_id"], headers, {"RUNNING"}, timeout_s=120)
    failing = running["node"]
    # Some seconds into its run: a run of 0 s is charged nothing, so has nothing to credit.
    wait_for(lambda: run_seconds(job["slurm_job_id"], run=mn_cmd) >= 3, timeout_s=60, interval_s=0.5,
             what="the job to run a few seconds")
    healthy = GPU2_NODE if failing == GPU4_NODE else GPU4_NODE
    devices = Path(f"/var/lib/gpupool-multinode/{failing}/emulated-gpus")
    hidden = sorted(devices.iterdir())
    try:
        # Every GPU of the node fails (its device files gone): whichever two the job holds are among them.
        for path in hidden:
            path.rename(path.with_name(f".{path.name}.hidden"))
        said = run_gpu_check(failing, tmp_path, slurm_wrappers)

        assert f"job {job['slurm_job_id']}: requeued" in said, said
        assert "Reason=gpu: " in node_line(failing) and "DRAIN" in node_line(failing), said
        # Requeued by Slurm onto the node that is not drained, where it runs to its end.
        requeued = wait_for(lambda: (runs := sacct_runs(job["slurm_job_id"], "State,NodeList,AdminComment"))[0]["State"]
                            == "REQUEUED" and runs, timeout_s=60, what="the failed run to be requeued")
        assert requeued[0]["NodeList"] == failing and requeued[0]["AdminComment"].startswith("gpu_failure: ")
        # A requeued job waits out a begin delay; shorten it (as an operator may).
        start_requeued_now(job["slurm_job_id"], run=mn_cmd)
        done = wait_for_state(client, job["job_id"], headers, {"COMPLETED", "FAILED", "CANCELLED"}, timeout_s=180)
        assert done["state"] == "COMPLETED" and done["node"] == healthy, done
        runs = wait_for(lambda: len(found := sacct_runs(job["slurm_job_id"])) == 2 and found[1]["End"] != "Unknown" and found,
                        timeout_s=60, what="sacct to record both runs")

        billing = ledger.cli("billing", "run", SLURM_CONF=MULTINODE_SLURM_CONF)
        assert billing.returncode == 0, billing.stderr

        # The failed run: charged and credited back in full; the run that completed: charged, at its own GPU's price.
        charged: dict[str, int] = {}
        for row in ledger.ledger(billed_account):
            if row[2] == str(job["slurm_job_id"]):
                charged[row[8]] = charged.get(row[8], 0) + row[16]
        assert set(charged) == {"rtx4090", "rtx3090"}, charged
        expected = {run["NodeList"]: 2 * int(run["ElapsedRaw"]) * GPU_PRICES[run["NodeList"]] for run in runs}
        assert sorted(charged.values()) == sorted(expected.values()), (charged, runs)
        period = f"{dt.datetime.now(dt.UTC):%Y-%m}"
        lines = list(csv.DictReader(io.StringIO(ledger.cli(
            "invoice", "--account", billed_account, "--period", period, "-o", "-").stdout)))
        credits = [line for line in lines if line["line_type"] == "adjustment" and f"job {job['slurm_job_id']} " in line["job_name"]]
        assert len(credits) == 1 and "ended by a GPU failure" in credits[0]["job_name"], lines
        assert round(float(credits[0]["amount"]) * 100) == -round(expected[failing] / 1e7)
        assert ledger.cli("billing", "run", SLURM_CONF=MULTINODE_SLURM_CONF).returncode == 0
        again = [line for line in csv.DictReader(io.StringIO(ledger.cli(
            "invoice", "--account", billed_account, "--period", period, "-o", "-").stdout)) if line["line_type"] == "adjustment"]
        assert len([line for line in again if f"job {job['slurm_job_id']} " in line["job_name"]]) == 1
    finally:
        for path in hidden:
            moved = path.with_name(f".{path.name}.hidden")
            if moved.exists():
                moved.rename(path)
        mn_cmd("scontrol", "update", f"nodename={failing}", "state=resume", check=False)
