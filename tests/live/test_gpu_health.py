"""The GPU health check on the local cluster: a GPU fails under a running job, the node drains, the operator resumes it.

Slurm runs gpupool-gpu-check on the node every HealthCheckInterval (15 s in
inventories/local). The node has no driver, so the check finds no nvidia-smi at
the path inventories/local gives it until a test writes a stand-in there; the
stand-in answers as the node's GPUs would, then as nvidia-smi does once one fell
off the bus. Separately, one of the placeholder device files gres.conf names is
taken away. Either way the node drains with a "gpu: " reason, and
`gpupool node resume` (whose audit row is checked) brings it back once the fault
is gone.

The job on the failed GPU is ended by the check (cancelled: it is no spot job),
with the failure in its AdminComment, which sacct shows; a billing pass then
credits its run (the invoice's charge and credit net to zero), the job's
end_reason says gpu_failure, and job.failed is enqueued for its webhook.

The pass also records the drain once for the operator (node_health_events).
and, with operator_webhook_url set, enqueues its node.drained for the operator's
webhook. A spot job on the failed GPU is requeued instead, and so is a
full-price job submitted with requeue_on_failure (sbatch --requeue); either's
failed run is credited. Not here: the operator's email and the sender's POST of
node.drained (tests/billing/test_gpu_failure_credits.py has them), and the
requeue onto a healthy node, which needs a second node (tests/multinode/test_node_failure.py).
A job whose processes die as its GPU fails, before the check runs, is ended by
the fault, not the check: the drain that follows credits its FAILED run.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import json
import os
import signal
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from bench.support.services import run_seconds, wait_for
from billing import passes
from billing.calendar import period_of
from billing.prices import set_price
from billing.sacct import read_gpu_failures
from gpupool import audit, db
from gpupool.config import Settings
from gpupool.gpu_health.check import promised_gpu_devices
from gpupool.models import NodeHealthEvent, WebhookEndpoint, WebhookEvent
from gpupool.proc import run_command
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import unpredictable_delimiter
from gpupool_cli import main as cli_main
from tests.conftest import wait_for_state

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CHECK_CONFIG = Path("/etc/slurm/gpupool-gpu-check.json")
# The check's modules as the playbook copied them to the node (slurm_compute_gpu_check_lib_dir).
INSTALLED_JOBS_MODULE = Path("/usr/local/lib/gpupool-gpu-check/gpupool/gpu_health/jobs.py")
LOST = "Unable to determine the device handle for GPU0000:{bus}: GPU is lost.  Reboot the system to recover this GPU\n"


class LocalNode:
    """The local cluster's node as its health check sees it, and the faults a test can give it."""

    def __init__(self) -> None:
        if not CHECK_CONFIG.exists():
            pytest.skip(f"{CHECK_CONFIG} is missing: the cluster predates the GPU health check (make cluster)")
        config = json.loads(CHECK_CONFIG.read_text())
        self.name: str = config["node_name"]
        self.nvidia_smi = Path(config["nvidia_smi"])
        if str(self.nvidia_smi).startswith("/usr/"):
            pytest.skip(f"the check's nvidia-smi is {self.nvidia_smi}, not a test stand-in path (inventories/local)")
        self.devices = [Path(p) for p in promised_gpu_devices(Path(config["gres_conf"]).read_text(), self.name)]
        self.interval_s = 15
        self.state_file = Path(config["state_dir"]) / "state.json"
        self.hidden: list[Path] = []

    def bus_id(self, index: int) -> str:
        return f"{0x41 + index:02X}:00.0"

    def answer_healthy(self) -> None:
        rows = [f"{n}, 00000000:{self.bus_id(n)}, NVIDIA GeForce RTX 4090, 60, [N/A], 0x0000000000000000, [N/A], [N/A]"
                for n in range(len(self.devices))]
        header = ("index, pci.bus_id, name, temperature.gpu, ecc.errors.uncorrected.volatile.total, "
                  "clocks_throttle_reasons.active, remapped_rows.pending, remapped_rows.failure")
        self._stand_in("\n".join([header, *rows]) + "\n", 0)

    def answer_fallen_off_the_bus(self, index: int) -> None:
        self._stand_in(LOST.format(bus=self.bus_id(index)), 15)

    def _stand_in(self, output: str, status: int) -> None:
        self.nvidia_smi.parent.mkdir(parents=True, exist_ok=True)
        answer = self.nvidia_smi.with_name("nvidia-smi.out")
        answer.write_text(output)
        temporary = self.nvidia_smi.with_name("nvidia-smi.new")
        temporary.write_text(f"#!/bin/sh\ncat {answer}\nexit {status}\n")
        temporary.chmod(temporary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(temporary, self.nvidia_smi)  # never a half-written script for a run that starts now

    def knows_bus_ids(self) -> bool:
        """The check has seen the stand-in's table once: it can tell which Slurm GPU index a lost bus id was."""
        try:
            known = json.loads(self.state_file.read_text()).get("gpu_indices", {})
        except (OSError, ValueError):
            return False
        return f"0000:{self.bus_id(len(self.devices) - 1).lower()}" in known

    def hide_device(self, path: Path) -> None:
        os.replace(path, path.with_name(path.name + ".hidden"))
        self.hidden.append(path)

    def restore(self) -> None:
        self.remove_stand_in()
        for path in self.hidden:
            moved = path.with_name(path.name + ".hidden")
            if moved.exists():
                os.replace(moved, path)

    def remove_stand_in(self) -> None:
        for name in ("nvidia-smi", "nvidia-smi.out", "nvidia-smi.new"):
            self.nvidia_smi.with_name(name).unlink(missing_ok=True)


@pytest.fixture
def node(slurm: SlurmClient) -> Iterator[LocalNode]:
    local = LocalNode()
    if slurm.node_status(local.name).out_of_service:
        pytest.skip(f"{local.name} is out of service before the test; leave it to its operator")
    yield local
    local.restore()
    if slurm.node_status(local.name).out_of_service:
        slurm.resume_node(local.name)


def resume_with_the_cli(
    settings: Settings, session_factory: sessionmaker, node: str, monkeypatch: pytest.MonkeyPatch
) -> int:
    """`gpupool node resume`, its audit row written in the test's own rolled-back transaction."""
    monkeypatch.setattr(cli_main, "load_settings", lambda: settings)
    monkeypatch.setattr(db, "migrated_sessions", lambda _url: session_factory)
    return cli_main.main(["node", "resume", node])


def wait_for_gpu_drain(slurm: SlurmClient, node: LocalNode) -> str | None:
    def drained() -> str | None:
        status = slurm.node_status(node.name)
        return status.reason if status.out_of_service and (status.reason or "").startswith("gpu: ") else None

    return wait_for(drained, timeout_s=node.interval_s * 2 + 30, interval_s=1, what=f"{node.name} to drain for its GPU")


def sacct_runs(slurm_job_id: int) -> list[dict[str, str]]:
    """Each run of the job as slurmdbd recorded it (a requeued job has one per start)."""
    result = run_command(
        ["sacct", "-X", "--duplicates", "--noheader", "--parsable2", "-j", str(slurm_job_id), "--format=State,AdminComment"],
        timeout_s=30,
    )
    runs = []
    for line in result.stdout.strip().splitlines():
        state, _, comment = line.partition("|")
        runs.append({"state": state, "admin_comment": comment})
    return runs


def sacct_run(slurm_job_id: int) -> dict[str, str]:
    return sacct_runs(slurm_job_id)[-1]


def add_endpoint(session_factory: sessionmaker, account: str) -> None:
    with session_factory() as session, session.begin():
        set_price(session, "*", 120_000, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        session.add(WebhookEndpoint(
            id="ep-gpu-failure", account=account, url="https://hooks.example.com/gpupool", events="job.ended,job.failed",
            secret="s" * 32,
        ))


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    slurm_job_id: int
    since: dt.datetime  # a billing window's start that holds the job's runs


@contextlib.contextmanager
def job_on_every_gpu(
    node: LocalNode, client: FlaskClient, auth: dict[str, str], session_factory: sessionmaker, account: str,
    message: str, **asked: bool,
) -> Iterator[RunningJob]:
    """A 10-minute job holding all the node's GPUs (so no other job holds the one that fails), running, the GPUs known
    to the check, and the account's endpoint hearing job.failed; cancelled afterwards whatever happened."""
    node.answer_healthy()
    since = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=1)
    add_endpoint(session_factory, account)
    created = client.post("/submit", headers=auth, json={
        "template": "hello", "gpus": len(node.devices), **asked, "params": {"message": message, "seconds": 600},
    }).get_json()
    assert all(created[key] is True for key in asked), created
    job_id = created["job_id"]
    try:
        wait_for_state(client, job_id, auth, {"RUNNING"}, timeout_s=60)
        slurm_job_id = client.get(f"/jobs/{job_id}", headers=auth).get_json()["slurm_job_id"]
        wait_for(node.knows_bus_ids, timeout_s=node.interval_s * 2 + 30, interval_s=1, what="a healthy check to read the GPUs")
        yield RunningJob(job_id, slurm_job_id, since)
    finally:
        client.delete(f"/jobs/{job_id}", headers=auth)


def test_a_gpu_falling_off_the_bus_under_a_job_ends_it_credits_it_and_resume_brings_the_node_back(
    node: LocalNode, slurm: SlurmClient, client: FlaskClient, auth: dict[str, str], account: str, settings: Settings,
    session_factory: sessionmaker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    with job_on_every_gpu(node, client, auth, session_factory, account, "gpu check") as job:
        job_id, slurm_job_id, since = job.job_id, job.slurm_job_id, job.since
        # While this job holds all the node's GPUs no other job holds the one that fails: the check ends this one alone.
        node.answer_fallen_off_the_bus(1)

        reason = wait_for_gpu_drain(slurm, node)

        lost = f"0000:{node.bus_id(1).lower()}"
        assert reason == f"gpu: {lost} is lost (fallen off the bus)"
        ended = wait_for_state(client, job_id, auth, {"CANCELLED"}, timeout_s=60)
        slurm_job_id = ended["slurm_job_id"]
        # Slurm's own record: cancelled, and the failure the check wrote where only an operator can write.
        recorded = wait_for(lambda: (run := sacct_run(slurm_job_id))["admin_comment"] and run, timeout_s=60, interval_s=1,
                            what="slurmdbd to record the job's end")
        assert recorded["state"].startswith("CANCELLED")
        assert recorded["admin_comment"].startswith(f"gpu_failure: {lost} is lost (fallen off the bus); node={node.name}; gpu={lost}; at=")
        delimiter = unpredictable_delimiter()
        [failure] = read_gpu_failures(slurm.admin_comments([slurm_job_id], delimiter), delimiter).values()

        archive = settings.replace(
            billing_archive_dir=str(tmp_path / "archive"), operator_webhook_url="https://alerts.example.com/gpupool",
        )
        first = passes.run_pass(session_factory, slurm, archive, since=since)
        again = passes.run_pass(session_factory, slurm, archive, since=since)

        # The window may hold an earlier run of this test's job too (another account's): the invoice below is this one's.
        # (When it fails, what the pass saw: the run's times beside the failure's, and the pass's counts.)
        seen = run_command(["sacct", "-X", "-D", "-P", "-j", str(slurm_job_id), "-o", "JobIDRaw,State,Start,End,ElapsedRaw"],
                           timeout_s=30).stdout
        assert first.credits >= 1 and again.credits == 0, (failure, seen, first)
        body = client.get(f"/jobs/{job_id}", headers=auth).get_json()
        assert body["end_reason"] == f"gpu_failure: {lost} is lost (fallen off the bus) (node {node.name})"
        invoice = client.get(f"/invoices/{period_of(failure.at)}", headers=auth)
        assert invoice.status_code == 200, invoice.data
        lines = list(csv.DictReader(io.StringIO(invoice.get_data(as_text=True))))
        charged = [line for line in lines if line["line_type"] == "job" and line["slurm_job_id"] == str(slurm_job_id)]
        credited = [line for line in lines if line["line_type"] == "adjustment" and f"job {slurm_job_id} " in line["job_name"]]
        assert charged and len(credited) == 1, lines
        assert sum(float(line["amount"]) for line in charged + credited) == 0, lines
        assert "ended by a GPU failure" in credited[0]["job_name"]
        assert charged[-1]["end_reason"] == body["end_reason"]  # the run's last line says why it ended
        with session_factory() as session:
            events = session.scalars(select(WebhookEvent).where(WebhookEvent.job_id == job_id, WebhookEvent.type == "job.failed")).all()
        assert [event.payload["data"]["gpu_failure"]["gpu"] for event in events] == [lost]
        assert events[0].payload["data"]["job"]["end_reason"].startswith("gpu_failure: ")
        # The drain, as the pass saw it in sinfo: recorded once, for the operator.
        with session_factory() as session:
            drains = session.execute(select(NodeHealthEvent.node, NodeHealthEvent.reason, NodeHealthEvent.resumed_at)).all()
        assert [tuple(drain) for drain in drains] == [(node.name, reason, None)]
        with session_factory() as session:
            told = session.scalars(select(WebhookEvent).where(WebhookEvent.type == "node.drained")).all()
        assert [(event.account, event.payload["data"]["node"]["reason"]) for event in told] == [(None, reason)]

        node.answer_healthy()
        assert resume_with_the_cli(settings, session_factory, node.name, monkeypatch) == 0
        assert not slurm.node_status(node.name).out_of_service
        with session_factory() as session:
            row = audit.events(session, limit=1)[0]
        assert (row.action, row.target, (row.details or {}).get("reason_before")) == ("node.resume", node.name, reason)


@pytest.mark.parametrize("asked", [{"preemptible": True}, {"requeue_on_failure": True}], ids=["spot", "requeue_on_failure"])
def test_a_job_that_may_be_requeued_is_requeued_off_a_gpu_that_fails_and_its_failed_run_credited(
    node: LocalNode, slurm: SlurmClient, client: FlaskClient, auth: dict[str, str], account: str, settings: Settings,
    session_factory: sessionmaker, tmp_path: Path, asked: dict[str, bool],
) -> None:
    if "requeue_on_failure" in asked and '"requeue"' not in INSTALLED_JOBS_MODULE.read_text():
        pytest.skip(f"{INSTALLED_JOBS_MODULE} predates requeue_on_failure (make cluster installs this checkout's check)")
    with job_on_every_gpu(node, client, auth, session_factory, account, "requeue", **asked) as job:
        job_id, slurm_job_id, since = job.job_id, job.slurm_job_id, job.since
        node.answer_fallen_off_the_bus(0)

        wait_for_gpu_drain(slurm, node)

        # Requeued, not cancelled: the failed run is REQUEUED in slurmdbd, with the failure beside it, and the job waits.
        runs = wait_for(lambda: (found := sacct_runs(slurm_job_id))[0]["state"] == "REQUEUED" and found, timeout_s=60,
                        interval_s=1, what="the job's run to be requeued")
        assert runs[0]["admin_comment"].startswith(f"gpu_failure: 0000:{node.bus_id(0).lower()} is lost")
        first = passes.run_pass(session_factory, slurm, settings.replace(billing_archive_dir=str(tmp_path / "archive")), since=since)

        assert first.credits >= 1
        body = client.get(f"/jobs/{job_id}", headers=auth).get_json()
        # The job goes on (requeued: COMPLETING, then PREEMPTED for spot, PENDING otherwise, until it runs again),
        # and has no end to explain.
        assert body["end_reason"] is None and body["state"] not in ("CANCELLED", "COMPLETED", "FAILED"), body
        with session_factory() as session:
            [event] = session.scalars(select(WebhookEvent).where(WebhookEvent.job_id == job_id, WebhookEvent.type == "job.failed"))
        assert event.payload["data"]["gpu_failure"]["requeued"] is True
        assert float(event.payload["data"]["credited"]) > 0


def kill_the_jobs_processes(slurm_job_id: int) -> None:
    """SIGKILL every process of the job, as a crash would end it: Slurm records the run FAILED, nobody cancelled it."""
    listed = run_command(["scontrol", "listpids", str(slurm_job_id)], timeout_s=30).stdout.splitlines()
    pids = [int(line.split()[0]) for line in listed[1:] if line.split() and line.split()[0].isdigit()]
    assert pids, listed
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_job_that_crashes_as_its_gpu_fails_before_the_check_runs_is_credited_by_the_drain_that_follows(
    node: LocalNode, slurm: SlurmClient, client: FlaskClient, auth: dict[str, str], account: str, settings: Settings,
    session_factory: sessionmaker, tmp_path: Path,
) -> None:
    with job_on_every_gpu(node, client, auth, session_factory, account, "crash") as job:
        job_id, slurm_job_id, since = job.job_id, job.slurm_job_id, job.since
        # The GPU falls off the bus and takes the job's processes with it, between two checks: the next check finds
        # the fault, but no job on the GPU to end.
        # Some seconds into its run: a run of 0 s is charged nothing, so has nothing to credit.
        wait_for(lambda: run_seconds(slurm_job_id) >= 3, timeout_s=60, interval_s=0.5, what="the job to run a few seconds")
        kill_the_jobs_processes(slurm_job_id)
        crashed_at = dt.datetime.now(dt.UTC)
        node.answer_fallen_off_the_bus(2)

        reason = wait_for_gpu_drain(slurm, node)
        wait_for_state(client, job_id, auth, {"FAILED"}, timeout_s=60)

        lost = f"0000:{node.bus_id(2).lower()}"
        assert reason == f"gpu: {lost} is lost (fallen off the bus)"
        run = wait_for(lambda: (found := sacct_run(slurm_job_id))["state"] == "FAILED" and found, timeout_s=60, interval_s=1,
                       what="slurmdbd to record the failed run")
        assert run["admin_comment"] == ""  # the check never saw the job: the drain alone ties the run to the failure
        configured = settings.replace(billing_archive_dir=str(tmp_path / "archive"), gpu_check_interval_s=node.interval_s)
        first = passes.run_pass(session_factory, slurm, configured, since=since)
        again = passes.run_pass(session_factory, slurm, configured, since=since)

        # (When it fails, what the pass saw: the run beside the drains it recorded.)
        seen = run_command(["sacct", "-X", "-D", "-P", "-j", str(slurm_job_id), "-o", "JobIDRaw,State,Start,End,NodeList"],
                           timeout_s=30).stdout
        with session_factory() as session:
            drains = session.execute(select(NodeHealthEvent.node, NodeHealthEvent.reason, NodeHealthEvent.drained_at)).all()
        assert first.credits >= 1 and again.credits == 0, (first, seen, drains)
        body = client.get(f"/jobs/{job_id}", headers=auth).get_json()
        assert body["end_reason"] == f"gpu_failure: {lost} is lost (fallen off the bus) (node {node.name})", (body, seen, drains)
        lines = list(csv.DictReader(io.StringIO(
            client.get(f"/invoices/{period_of(crashed_at)}", headers=auth)
            .get_data(as_text=True))))
        charged = [line for line in lines if line["line_type"] == "job" and line["slurm_job_id"] == str(slurm_job_id)]
        credited = [line for line in lines if line["line_type"] == "adjustment" and f"job {slurm_job_id} " in line["job_name"]]
        assert charged and len(credited) == 1, lines
        assert sum(float(line["amount"]) for line in charged + credited) == 0, lines
        assert "failed as a GPU failed under it" in credited[0]["job_name"]
        with session_factory() as session:
            events = session.scalars(select(WebhookEvent).where(WebhookEvent.job_id == job_id, WebhookEvent.type == "job.failed")).all()
        assert [event.payload["data"]["gpu_failure"]["gpu"] for event in events] == [lost]


def test_a_missing_device_file_drains_the_node_where_there_is_no_nvidia_smi(node: LocalNode, slurm: SlurmClient) -> None:
    node.remove_stand_in()
    node.hide_device(node.devices[-1])

    reason = wait_for_gpu_drain(slurm, node)

    assert reason == f"gpu: {node.devices[-1]} missing (gres.conf names it)"
