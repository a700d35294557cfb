"""Idle GPUs on the real cluster: real 2-GPU jobs, their real GRES indices, recorded exporter output over HTTP.

The node's GPUs are emulated, so the exporter is tests.support.gpu_exporter: the
recorded nvidia-smi capture of an H100, served on 127.0.0.1 as
nvidia_gpu_exporter serves it, with the utilization of each GPU index set by
the test. The check passes run with a clock the test advances a minute at a
time; Slurm, the run-as helper, scancel and sacct are real.

Two passes at once need two connections, which a test's rolled-back
transaction cannot give: those tests make a database of their own, on
PostgreSQL (where the advisory lock keeps passes apart) and on SQLite (where
the claim on the job's row does).
"""

from __future__ import annotations

import datetime as dt
import pwd
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from api.event_schemas import validate_event
from bench.support.services import create_database, drop_database
from bench.support.tenancy import TENANT_PREFIX, sbatch_as_tenant
from gpupool import db
from gpupool.config import Settings
from gpupool.db import utcnow
from gpupool.gpu_usage.exporter import NodeMetrics, scrape_cluster
from gpupool.gpu_usage.idle import CheckResult, check_idle, set_policy
from gpupool.models import AlertSettings, EmailOutbox, GpuSample, Job, WebhookDelivery, WebhookEndpoint, WebhookEvent
from gpupool.models.gpu_usage import ACCOUNT
from gpupool.sessions import sweep_idle
from gpupool.slurm.client import SlurmClient
from tests.api.test_web import signed_in
from tests.conftest import (
    add_account_row,
    bearer,
    cancel_account_jobs,
    create_app_for_tests,
    sacct_row,
    slurm_cmd,
    wait_for,
    wait_for_state,
)
from tests.support.gpu_exporter import FakeNodeExporter, serve_exporter

NODE = "vm"
WINDOW_MIN, THRESHOLD_PCT, GRACE_MIN = 3, 5, 2
ALERT_EMAIL = "ops@idle.example"
HOOK_URL = "https://hooks.example.com/idle"
OTHER_GPUS_PCT = 97.0  # the node's GPUs the job does not hold: busy, so a wrong mapping shows


@pytest.fixture
def exporter() -> Iterator[FakeNodeExporter]:
    with serve_exporter(dict.fromkeys(range(4), OTHER_GPUS_PCT)) as served:
        yield served


@pytest.fixture
def idle_settings(settings: Settings, exporter: FakeNodeExporter) -> Settings:
    # One node here, so one address for it; smtp_host set: emails are queued (this test sends none).
    return settings.replace(
        gpu_exporter_url="http://127.0.0.1:{port}/metrics", gpu_exporter_port=exporter.port,
        gpu_exporter_timeout_s=5.0, smtp_host="127.0.0.1", idle_window_min=0,
    )


def watch(session_factory: sessionmaker, account: str) -> str:
    """The account with an idle policy that cancels, an alert email and a webhook endpoint for job.idle."""
    now = utcnow()
    with session_factory() as session, session.begin():
        set_policy(session, ACCOUNT, account, window_min=WINDOW_MIN, threshold_pct=THRESHOLD_PCT, grace_min=GRACE_MIN, cancel=True, now=now)
        session.add(AlertSettings(account=account, thresholds="50,80,100", email=ALERT_EMAIL, updated_at=now))
        session.add(WebhookEndpoint(id=f"ep-idle-{account}", account=account, url=HOOK_URL, events="job.idle", secret="s", created_at=now))
    return account


@pytest.fixture
def watched(session_factory: sessionmaker, account: str) -> str:
    return watch(session_factory, account)


@pytest.fixture(params=["postgresql", "sqlite"])
def own_database(request: pytest.FixtureRequest, slurm_account: str, tmp_path: Path) -> Iterator[tuple[str, str, sessionmaker]]:
    """A database of the test's own: its backend, its URL, and sessions on it that commit for real; the session's
    account watched. SQLite is a file, as ``make run`` keeps it."""
    name = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/idle.db"
    else:
        name = f"gpupool_idle_{secrets.token_hex(4)}"
        url = create_database(name)  # migrated
    engine = db.make_engine(url)
    try:
        if name is None:
            db.upgrade(engine)
        factory = db.make_session_factory(engine)
        add_account_row(factory, slurm_account)
        watch(factory, slurm_account)
        yield request.param, url, factory
    finally:
        cancel_account_jobs(slurm_account)
        engine.dispose()
        if name is not None:
            drop_database(name)


def running_job(client: FlaskClient, auth: dict[str, str], body: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """Submit a job through the API, wait until it runs, and read its GPU indices from scontrol."""
    submitted = client.post("/submit", headers=auth, json=body)
    assert submitted.status_code == 201, submitted.get_json()
    job = wait_for_state(client, submitted.get_json()["job_id"], auth, {"RUNNING"}, timeout_s=180)
    text = slurm_cmd("scontrol", "--details", "show", "job", str(job["slurm_job_id"]))
    # Read with a plain pattern here, not with the parser the check uses.
    found = re.search(r"GRES=gpu:\w+:(\d+)\(IDX:([\d,-]+)\)", text)
    assert found, f"scontrol printed no GPU indices: {text}"
    indices: list[int] = []
    for part in found[2].split(","):
        low, _, high = part.partition("-")
        indices += range(int(low), int(high or low) + 1)
    assert len(indices) == int(found[1]) == body["gpus"], text
    return job, indices


def running_two_gpu_job(client: FlaskClient, auth: dict[str, str]) -> tuple[dict[str, Any], tuple[int, int]]:
    job, (first, second) = running_job(client, auth, {"template": "hello", "gpus": 2, "params": {"seconds": 900}})
    return job, (first, second)


def report_window(start: dt.datetime) -> str:
    """A report range of whole UTC hours around passes that start at ``start`` and run a few minutes."""
    hour = start.replace(minute=0, second=0, microsecond=0)
    return f"since={hour:%Y-%m-%dT%H:%M:%SZ}&until={hour + dt.timedelta(hours=2):%Y-%m-%dT%H:%M:%SZ}"


def idle_seconds_served(served: dict[int, list[float]]) -> int:
    """GPU-seconds idle by what the exporter served, one pass a minute: each minute between two samples under the threshold."""
    return sum(60 * sum(1 for a, b in zip(values, values[1:], strict=False) if a < THRESHOLD_PCT and b < THRESHOLD_PCT) for values in served.values())


def passes(session_factory: sessionmaker, settings: Settings, slurm: SlurmClient, start: dt.datetime, minutes: range) -> list[CheckResult]:
    results = []
    for minute in minutes:
        with session_factory() as session:
            results.append(check_idle(session, settings, slurm, start + dt.timedelta(minutes=minute)))
    return results


def idle_events(session_factory: sessionmaker, job_id: str) -> list[dict[str, Any]]:
    with session_factory() as session:
        return [event.payload for event in session.scalars(select(WebhookEvent).where(WebhookEvent.job_id == job_id, WebhookEvent.type == "job.idle"))]


def test_a_job_idle_on_both_gpus_gets_job_idle_then_is_cancelled_after_the_grace(
    client: FlaskClient, auth: dict[str, str], watched: str, idle_settings: Settings, slurm: SlurmClient,
    session_factory: sessionmaker, exporter: FakeNodeExporter, app: Flask, settings: Settings,
) -> None:
    job, (first, second) = running_two_gpu_job(client, auth)
    job_id = job["job_id"]
    exporter.utilization.update({first: 0.0, second: 0.0})
    served = {first: [0.0] * (WINDOW_MIN + GRACE_MIN + 1), second: [0.0] * (WINDOW_MIN + GRACE_MIN + 1)}  # minutes 0..5
    start = utcnow()

    # Minutes 0..2: under the threshold, but not yet for the whole window.
    before = passes(session_factory, idle_settings, slurm, start, range(WINDOW_MIN))
    assert [result.notified for result in before] == [[], [], []]
    assert all(result.samples == 2 and not result.node_errors for result in before), before
    assert idle_events(session_factory, job_id) == []

    # Minute 3: the whole window: job.idle, once, by webhook and email.
    (at_window,) = passes(session_factory, idle_settings, slurm, start, range(WINDOW_MIN, WINDOW_MIN + 1))
    assert at_window.notified == [job_id]
    events = idle_events(session_factory, job_id)
    assert len(events) == 1
    idle = events[0]["data"]["idle"]
    assert idle["gpus"] == [{"node": NODE, "index": first}, {"node": NODE, "index": second}]
    assert idle["policy"] == {"window_min": WINDOW_MIN, "threshold_pct": THRESHOLD_PCT, "grace_min": GRACE_MIN, "cancel": True, "source": f"account {watched}"}
    assert events[0]["data"]["job"]["job_id"] == job_id
    validate_event(events[0])  # as the OpenAPI document's webhooks section describes it
    with session_factory() as session:
        deliveries = session.scalars(select(WebhookDelivery.endpoint_id).join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id).where(WebhookEvent.job_id == job_id)).all()
        assert deliveries == [f"ep-idle-{watched}"]
        mails = session.execute(select(EmailOutbox.recipient, EmailOutbox.subject).where(EmailOutbox.account == watched)).all()
        assert mails == [(ALERT_EMAIL, f"gpupool: job {job_id} of account {watched} has idle GPUs")]

    shown = client.get(f"/jobs/{job_id}", headers=auth).get_json()
    usage = shown["gpu_usage"]
    assert usage["idle_notified_at"] is not None and usage["idle_cancelled_at"] is None
    assert [(gpu["node"], gpu["index"]) for gpu in usage["gpus"]] == [(NODE, first), (NODE, second)]
    assert all([sample["utilization_pct"] for sample in gpu["samples"]] == [0.0] * 4 for gpu in usage["gpus"])
    assert all(sample["memory_used_mib"] == 19818.0 for gpu in usage["gpus"] for sample in gpu["samples"])  # the capture's
    # The job page: the notice, and one line per GPU in the server-drawn chart.
    page = signed_in(app.test_client(), settings, watched).get(f"/ui/jobs/{job_id}").get_data(as_text=True)
    assert 'id="job-idle"' in page and 'id="gpu-utilization"' in page
    assert re.findall(r'<polyline class="line"[^>]*data-series="([^"]+)"', page) == [f"{NODE} GPU {first}", f"{NODE} GPU {second}"]

    # Minute 4: inside the grace: nothing more, and Slurm still runs it. The pass runs twice (a timer that
    # fired twice): the second records a sample 0 s after the first and must count no stretch again.
    (in_grace,) = passes(session_factory, idle_settings, slurm, start, range(WINDOW_MIN + 1, WINDOW_MIN + GRACE_MIN))
    assert (in_grace.notified, in_grace.cancelled) == ([], [])
    (again,) = passes(session_factory, idle_settings, slurm, start, range(WINDOW_MIN + 1, WINDOW_MIN + GRACE_MIN))
    assert (again.samples, again.notified, again.cancelled) == (2, [], [])
    assert "JobState=RUNNING" in slurm_cmd("scontrol", "show", "job", str(job["slurm_job_id"]))

    # Minute 5: past the grace and still idle: cancelled as its tenant.
    (past_grace,) = passes(session_factory, idle_settings, slurm, start, range(WINDOW_MIN + GRACE_MIN, WINDOW_MIN + GRACE_MIN + 1))
    assert past_grace.cancelled == [job_id]
    state = wait_for(
        lambda: sacct_row(job["slurm_job_id"], "JobID,State").get("State", "").split(" ")[0] == "CANCELLED",
        timeout_s=60, what="sacct to say CANCELLED",
    )
    assert state
    ended = wait_for_state(client, job_id, auth, {"CANCELLED"}, timeout_s=60)
    assert ended["end_reason"].startswith(f"idle: every GPU under {THRESHOLD_PCT}% for {WINDOW_MIN} min")
    assert ended["gpu_usage"]["idle_cancelled_at"] is not None
    assert len(idle_events(session_factory, job_id)) == 1  # never a second job.idle for the same spell

    # The operator report: 5 idle minutes (samples at minutes 0..5) on each of the 2 GPUs, once, for the job's
    # account and template.
    idle_s = idle_seconds_served(served)
    assert idle_s == 600
    admin = bearer(settings, watched, sub="ops", role="admin")
    report = client.get(f"/admin/report?{report_window(start)}", headers=admin).get_json()
    assert report["idle_gpus"]["by_account"] == [{"account": watched, "gpu_seconds": idle_s, "gpu_hours": "0.17"}]
    assert report["idle_gpus"]["by_template"] == [{"template": "hello", "gpu_seconds": idle_s, "gpu_hours": "0.17"}]
    assert (report["idle_gpus"]["gpu_seconds"], report["idle_gpus"]["share_of_gpu_hours_sold"]) == (idle_s, None)  # none billed
    page = signed_in(app.test_client(), settings, watched, sub="ops", role="admin").get(f"/ui/admin/report?{report_window(start)}")
    body = page.get_data(as_text=True)
    assert 'id="idle-gpu-hours">0.17<' in body and f"<td>{watched}</td><td class=\"num\">0.17</td><td class=\"num\">600</td>" in body


def test_a_job_at_90_percent_on_one_of_its_two_gpus_gets_nothing(
    client: FlaskClient, auth: dict[str, str], watched: str, idle_settings: Settings, slurm: SlurmClient,
    session_factory: sessionmaker, exporter: FakeNodeExporter, settings: Settings,
) -> None:
    job, (first, second) = running_two_gpu_job(client, auth)
    exporter.utilization.update({first: 90.0, second: 0.0})
    start = utcnow()
    results = passes(session_factory, idle_settings, slurm, start, range(WINDOW_MIN + GRACE_MIN + 3))
    assert all(result.samples == 2 and result.notified == [] and result.cancelled == [] for result in results), results
    assert idle_events(session_factory, job["job_id"]) == []
    with session_factory() as session:
        assert session.scalars(select(EmailOutbox.id).where(EmailOutbox.account == watched)).all() == []
        row = session.get(Job, job["job_id"])
        assert row is not None and (row.idle_since, row.idle_notified_at, row.idle_cancelled_at, row.end_reason) == (None, None, None, None)
        utilizations = sorted({(s.gpu_index, s.utilization_pct) for s in session.scalars(select(GpuSample).where(GpuSample.job_id == job["job_id"]))})
        assert utilizations == sorted([(first, 90.0), (second, 0.0)])
    assert "JobState=RUNNING" in slurm_cmd("scontrol", "show", "job", str(job["slurm_job_id"]))
    # Not an idle job, but one idle GPU: its 7 minutes count in the report's idle GPU-hours.
    idle_s = idle_seconds_served({first: [90.0] * 8, second: [0.0] * 8})
    admin = bearer(settings, watched, sub="ops", role="admin")
    idle = client.get(f"/admin/report?{report_window(start)}", headers=admin).get_json()["idle_gpus"]
    assert (idle_s, idle["gpu_seconds"], idle["by_account"][0]["account"]) == (420, 420, watched)


def test_a_session_idle_on_its_gpu_is_cancelled_by_the_policy_and_its_session_ends_with_the_reason(
    client: FlaskClient, auth: dict[str, str], watched: str, idle_settings: Settings, slurm: SlurmClient,
    session_factory: sessionmaker, exporter: FakeNodeExporter,
) -> None:
    """A session job is judged like any job: job.idle, then the cancel after the grace, whatever its browser does."""
    app_command = 'exec python3 -m http.server --bind 127.0.0.1 "$GPUPOOL_APP_PORT"'
    job, (index,) = running_job(client, auth, {"template": "webapp", "gpus": 1, "params": {"command": app_command}})
    job_id = job["job_id"]
    exporter.utilization[index] = 0.0
    start = utcnow()
    results = passes(session_factory, idle_settings, slurm, start, range(WINDOW_MIN + GRACE_MIN + 1))
    assert [result.notified for result in results] == [[], [], [], [job_id], [], []]
    assert [result.cancelled for result in results] == [[], [], [], [], [], [job_id]]
    # Over for the proxy and the page at once, with the policy's reason, before Slurm has even ended it.
    session = client.get(f"/jobs/{job_id}/session", headers=auth).get_json()
    assert session["state"] == "ended" and session["end_reason"].startswith(f"idle: every GPU under {THRESHOLD_PCT}% for {WINDOW_MIN} min")
    # The session sweep, for which the session is long past its idle timeout, neither cancels it again nor rewrites why.
    with session_factory() as db_session:
        assert sweep_idle(db_session, idle_settings, slurm, start + dt.timedelta(hours=2)) == []
    ended = wait_for_state(client, job_id, auth, {"CANCELLED"}, timeout_s=60)
    assert ended["end_reason"] == session["end_reason"]
    assert sacct_row(job["slurm_job_id"], "JobID,State")["State"].startswith("CANCELLED")


class HeldScrape:
    """The exporters' scrape, where the first pass to reach it waits until the test lets it go on.

    That pass has by then done all it does before scraping (the lock, reading the jobs); every other pass scrapes at once.
    """

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go_on = threading.Event()
        self._lock = threading.Lock()
        self._first = True

    def __call__(self, nodes: Iterable[str], settings: Settings) -> Mapping[str, NodeMetrics]:
        with self._lock:
            first, self._first = self._first, False
        if first:
            self.reached.set()
            assert self.go_on.wait(120), "the test never let the held pass go on"
        return scrape_cluster(nodes, settings)


def two_passes_at_once(factory: sessionmaker, settings: Settings, slurm: SlurmClient, at: dt.datetime) -> tuple[CheckResult, CheckResult]:
    """(held, other): a pass held just before its scrape while another, on a connection of its own, runs whole."""
    scrape = HeldScrape()
    outcome: list[CheckResult | BaseException] = []

    def held_pass() -> None:
        try:
            with factory() as session:
                outcome.append(check_idle(session, settings, slurm, at, scrape))
        except BaseException as exc:  # noqa: B036  (handed to the test's thread, which raises it)
            outcome.append(exc)

    thread = threading.Thread(target=held_pass)
    thread.start()
    try:
        assert scrape.reached.wait(120), f"the held pass never reached its scrape: {outcome}"
        # Another host's pass, its clock a second on.
        with factory() as session:
            other = check_idle(session, settings, slurm, at + dt.timedelta(seconds=1), scrape)
    finally:
        scrape.go_on.set()
        thread.join(120)
    (held,) = outcome
    if isinstance(held, BaseException):
        raise held
    return held, other


def test_two_passes_at_once_send_one_job_idle_and_cancel_once(
    own_database: tuple[str, str, sessionmaker], slurm_account: str, idle_settings: Settings, slurm: SlurmClient,
    exporter: FakeNodeExporter,
) -> None:
    """Two passes overlap (a timer on two API hosts, a manual pass beside the timer's) at the window and past the grace.

    On PostgreSQL the held pass holds the advisory lock and the other does nothing. SQLite has no such lock: both
    decide, the held one from the job's row as it read it before the other ran whole, and only the pass whose
    claim on the row changed it (the other) sends job.idle, then cancels.
    """
    backend, url, factory = own_database
    settings = idle_settings.replace(database_url=url)
    client = create_app_for_tests(settings, slurm, factory).test_client()
    auth = bearer(settings, slurm_account)
    job, (first, second) = running_two_gpu_job(client, auth)
    job_id = job["job_id"]
    exporter.utilization.update({first: 0.0, second: 0.0})
    start = utcnow()
    assert [result.notified for result in passes(factory, settings, slurm, start, range(WINDOW_MIN))] == [[], [], []]

    def overlap(at: dt.datetime) -> tuple[CheckResult, CheckResult, dt.datetime]:
        """(the pass that acted, the one that did not, the acting pass's clock), the held pass's clock at ``at``."""
        held, other = two_passes_at_once(factory, settings, slurm, at)
        if backend == "postgresql":
            assert (held.skipped, other.skipped, other.jobs, other.samples) == (False, True, 0, 0)
            return held, other, at
        assert (held.skipped, held.jobs, held.samples, other.skipped) == (False, 1, 2, False)
        return other, held, at + dt.timedelta(seconds=1)

    acted, not_acted, notified_at = overlap(start + dt.timedelta(minutes=WINDOW_MIN))
    assert (acted.notified, not_acted.notified) == ([job_id], [])
    assert len(idle_events(factory, job_id)) == 1
    with factory() as session:
        assert len(session.scalars(select(EmailOutbox.id).where(EmailOutbox.account == slurm_account)).all()) == 1
        row = session.get(Job, job_id)
        assert row is not None and row.idle_notified_at == notified_at

    (in_grace,) = passes(factory, settings, slurm, start, range(WINDOW_MIN + 1, WINDOW_MIN + 2))
    assert (in_grace.skipped, in_grace.notified, in_grace.cancelled) == (False, [], [])  # any lock was let go
    # Both passes past the grace, counted from the notice: each, alone, would cancel.
    acted, not_acted, cancelled_at = overlap(notified_at + dt.timedelta(minutes=GRACE_MIN))
    assert (acted.cancelled, not_acted.cancelled) == ([job_id], [])
    ended = wait_for_state(client, job_id, auth, {"CANCELLED"}, timeout_s=60)
    assert ended["end_reason"].startswith(f"idle: every GPU under {THRESHOLD_PCT}% for {WINDOW_MIN} min")
    assert sacct_row(job["slurm_job_id"], "JobID,State")["State"].startswith("CANCELLED")
    assert len(idle_events(factory, job_id)) == 1
    with factory() as session:
        row = session.get(Job, job_id)
        assert row is not None and row.idle_cancelled_at == cancelled_at


def forge_in_comment(victim: int, account: str, idle: list[int], forger: str) -> None:
    """A held job whose comment holds, after a newline, a whole line for ``victim``: its account, its tenant user,
    its 2 GPUs, but ``idle`` ones. Slurm writes the comment after the allocation, so the line is read as written."""
    user = TENANT_PREFIX + account
    uid = pwd.getpwnam(user).pw_uid
    forged = (
        f"JobId={victim} JobName=forged UserId={user}({uid}) GroupId={user}({uid}) Account={account} JobState=RUNNING "
        f"Reason=None NodeList={NODE} NumNodes=1 Nodes={NODE} CPU_IDs=0 Mem=1 GRES=gpu:rtx4090:2(IDX:{idle[0]},{idle[1]}) "
        "MinCPUsNode=1 WorkDir=/tmp"
    )
    sbatch_as_tenant(forger, "--gres=gpu:1", "--hold", f"--comment=x\n{forged}", wrap="true")


def forge_in_name(victim: int, account: str, idle: list[int], forger: str) -> None:
    """A running 1-GPU job whose name holds, after a newline, the start of a line for ``victim``. Slurm writes the
    name before the allocation, so the rest of that line is the forger's own: its user, account, state and GPU,
    which it leaves idle. (What comes before the newline makes the forger's own line whole, so the pass reads on.)"""
    user = TENANT_PREFIX + forger
    name = f"x UserId={user}(1) Account={forger} JobState=PENDING\nJobId={victim} JobName=forged"
    job_id = sbatch_as_tenant(forger, "--gres=gpu:1", f"--job-name={name}", wrap="sleep 300")
    wait_for(lambda: slurm_cmd("squeue", "-h", "-j", str(job_id), "-o", "%T").strip() == "RUNNING", timeout_s=120, what="the forger's job to run")


@pytest.mark.parametrize("forge", [forge_in_comment, forge_in_name], ids=["comment", "name"])
def test_a_forged_scontrol_line_for_another_tenants_job_neither_notifies_nor_cancels_it(
    client: FlaskClient, auth: dict[str, str], watched: str, other_account: str, idle_settings: Settings, slurm: SlurmClient,
    session_factory: sessionmaker, exporter: FakeNodeExporter, forge: Callable[[int, str, list[int], str], None],
) -> None:
    """Another tenant writes, after a newline in its own job's text, a line for the victim's running job on idle GPUs.

    The victim's own GPUs are busy. In its comment the forged line is the victim's in every word (only scontrol
    printing the job twice gives it away); in its name it is the forger's (its account, user and 1 GPU give it away).
    """
    job, (first, second) = running_two_gpu_job(client, auth)
    victim = job["slurm_job_id"]
    idle = sorted(set(range(4)) - {first, second})
    exporter.utilization.update({first: 90.0, second: 90.0, **dict.fromkeys(idle, 0.0)})
    forge(victim, watched, idle, other_account)
    # scontrol prints the forged line as a line of its own, after the victim's real one (the forger's job id is
    # the later): read in order, the forged line is the one that would count.
    printed = slurm_cmd("scontrol", "show", "job", "--details", "--oneliner")
    names = re.findall(rf"^JobId={victim} JobName=(\S*)", printed, re.MULTILINE)
    assert len(names) == 2 and names[0] != "forged" and names[1] == "forged", printed

    results = passes(session_factory, idle_settings, slurm, utcnow(), range(WINDOW_MIN + GRACE_MIN + 2))
    assert all(result.notified == [] and result.cancelled == [] for result in results), results
    assert idle_events(session_factory, job["job_id"]) == []
    assert "JobState=RUNNING" in slurm_cmd("scontrol", "show", "job", str(victim))
    with session_factory() as session:
        row = session.get(Job, job["job_id"])
        assert row is not None and (row.idle_notified_at, row.idle_cancelled_at, row.end_reason) == (None, None, None)
        sampled = set(session.scalars(select(GpuSample.gpu_index).where(GpuSample.job_id == job["job_id"])))
    assert sampled <= {first, second}  # never a sample of the victim's job on a GPU it does not hold
