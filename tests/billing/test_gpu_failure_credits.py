"""Runs a failed GPU ended, credited by the billing pass on PostgreSQL and SQLite: invoice lines, end_reason, job.failed, once.

sacct's answers are written here (behind SlurmClient's runner seam): the pass's
window, and the AdminComment gpupool-gpu-check leaves on each job it ends
(gpupool.gpu_health.failure). tests/live/test_gpu_health.py has the real check,
Slurm and sacct doing the same.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Mapping

import pytest
from gpupool_client import InvalidSignature, verify_signature
from sqlalchemy import select

from api.event_schemas import validate_event
from billing import passes
from billing.report import build_report
from billing.sacct import PASS_FIELDS
from gpupool import audit
from gpupool.gpu_health.failure import GpuFailure
from gpupool.models import Adjustment, EmailOutbox, Job, NodeHealthEvent, WebhookEndpoint, WebhookEvent
from gpupool.models.webhooks import WebhookDelivery
from gpupool.proc import CommandResult
from gpupool.slurm.client import SlurmClient
from gpupool.webhooks.sender import WebhookSender
from tests.billing.conftest import RTX4090_NANOS, LedgerDb
from tests.billing.test_report_invoices import NoCluster
from tests.support.receiver import serve_webhooks


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


XID_79 = GpuFailure(reason="Xid 79 on 0000:41:00.0", node="gpu1", gpu="0000:41:00.0", at=utc("2026-11-03T00:59:58"), xid=79)
LOST = GpuFailure(
    reason="0000:42:00.0 is lost (fallen off the bus)", node="gpu1", gpu="0000:42:00.0", at=utc("2026-11-03T02:29:59"),
)
# (JobIDRaw, State, Start, End, QOS, AdminComment) of each run sacct holds.
RUNS = [
    (41, "CANCELLED by 0", "2026-11-03T00:00:00", "2026-11-03T01:00:00", "normal", XID_79.comment()),
    # A spot job: requeued off the failed GPU, then completed elsewhere; both runs carry the comment.
    (42, "REQUEUED", "2026-11-03T02:00:00", "2026-11-03T02:30:00", "spot", LOST.comment()),
    (42, "COMPLETED", "2026-11-03T02:32:00", "2026-11-03T03:00:00", "spot", LOST.comment()),
    (43, "CANCELLED by 1001", "2026-11-03T04:00:00", "2026-11-03T04:10:00", "normal", ""),
    (44, "COMPLETED", "2026-11-03T05:00:00", "2026-11-03T05:10:00", "normal", "replaced the fan; Kim"),
]


class Sacct:
    """sacct as the pass asks it: the window's runs, then the AdminComment of the runs a failure may have ended."""

    def __init__(self, runs: list[tuple[int, str, str, str, str, str]] = RUNS, on: Mapping[int, str] | None = None) -> None:
        self.runs = runs
        self.on = on or {}  # each job's node (sacct's NodeList); gpu1 unless named
        self.asked_for_comments: list[str] = []
        self.nodes: list[dict[str, object]] = []  # sinfo --json's nodes, Slurm 22.05's shape

    def __call__(self, argv: list[str], *, timeout_s: float, env: Mapping[str, str] | None = None, **_: object) -> CommandResult:
        if argv[0].endswith("sinfo"):
            return CommandResult(tuple(argv), 0, json.dumps({"nodes": self.nodes}), "", 0.0)
        d = next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--delimiter="))
        jobs = next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--jobs=")), None)
        if jobs is not None:
            self.asked_for_comments.append(jobs)
            wanted = {int(job) for job in jobs.split(",")}
            lines = [d.join(["JobIDRaw", "Start", "AdminComment"])]
            lines += [d.join([str(job), start, comment]) for job, _, start, _, _, comment in self.runs if job in wanted]
            return CommandResult(tuple(argv), 0, "\n".join(lines) + "\n", "", 0.0)
        lines = [d.join(PASS_FIELDS)]
        for job, state, start, end, qos, _ in self.runs:
            elapsed = int((utc(end) - utc(start)).total_seconds())
            lines.append(d.join([
                "gpupool", str(job), str(job), "acme", "gp-acme", state, start, start, end, str(elapsed),
                "cpu=1,gres/gpu:rtx4090=1,gres/gpu=1", qos, self.on.get(job, "gpu1"), f"job{job}",
            ]))
        return CommandResult(tuple(argv), 0, "\n".join(lines) + "\n", "", 0.0)


def bill(ledger: LedgerDb, sacct: Sacct, now: str = "2026-11-03T12:00:00", **settings: object) -> passes.PassReport:
    configured = ledger.settings.replace(**settings)
    return passes.run_pass(ledger.sessions, SlurmClient(configured, runner=sacct), configured, now=utc(now))


def add_job(ledger: LedgerDb, job_id: str, slurm_job_id: int) -> None:
    """The gpupool job of a Slurm job, finished as the refresher left it, and an endpoint that hears all its events."""
    with ledger.sessions() as session, session.begin():
        created = utc("2026-11-02T23:59:00")
        session.add(Job(
            id=job_id, account="acme", owner="alice", name="train", template="hello", params={}, gpus=1, cpus=1,
            mem_gb=1, time_limit_min=600, job_dir="/nonexistent", slurm_job_id=slurm_job_id, state="CANCELLED",
            finished=True, request_hash="0" * 64, created_at=created, updated_at=created,
        ))
        session.add(WebhookEndpoint(
            id=f"ep-{job_id}", account="acme", url="https://hooks.example.com/gpupool", events="job.ended,job.failed",
            secret="s" * 32, created_at=created,
        ))


def credits(ledger: LedgerDb) -> list[tuple[str, int, str, str]]:
    with ledger.sessions() as session:
        rows = session.execute(
            select(Adjustment.period, Adjustment.amount_nanos, Adjustment.kind, Adjustment.reason).order_by(Adjustment.id)
        )
        return [tuple(row) for row in rows]  # type: ignore[misc]


def test_a_run_a_failed_gpu_ended_is_credited_once_with_its_reason_and_the_owner_is_told(ledger_db: LedgerDb) -> None:
    ledger_db.add_account("acme")
    add_job(ledger_db, "job-41", 41)
    sacct = Sacct()

    report = bill(ledger_db, sacct)

    hour = 3600 * RTX4090_NANOS
    assert credits(ledger_db) == [
        ("2026-11", -hour, "gpu_failure_credit",
         "automatic credit: job 41 ended by a GPU failure (gpu_failure: Xid 79 on 0000:41:00.0 (node gpu1))"),
        ("2026-11", -1800 * RTX4090_NANOS, "gpu_failure_credit",
         "automatic credit: job 42 ended by a GPU failure (gpu_failure: 0000:42:00.0 is lost (fallen off the bus) (node gpu1))"),
    ]
    assert report.credits == 2
    assert sacct.asked_for_comments == ["41,42,43"]  # not the completed runs: no failure ended them
    with ledger_db.sessions() as session:
        job = session.get(Job, "job-41")
        assert job is not None
        assert job.end_reason == "gpu_failure: Xid 79 on 0000:41:00.0 (node gpu1)"
        [event] = session.scalars(select(WebhookEvent)).all()
    assert event.type == "job.failed"
    assert event.payload["data"]["job"]["end_reason"] == "gpu_failure: Xid 79 on 0000:41:00.0 (node gpu1)"
    assert event.payload["data"]["gpu_failure"] == {
        "node": "gpu1", "gpu": "0000:41:00.0", "xid": 79, "reason": "Xid 79 on 0000:41:00.0", "at": "2026-11-03T00:59:58Z",
        "requeued": False,
    }
    assert event.payload["data"]["credited"] == "0.432"

    lines = list(csv.reader(io.StringIO(ledger_db.cli("invoice", "--account", "acme", "--period", "2026-11", "-o", "-").stdout)))
    header = lines[0]
    amount = header.index("amount")
    by_job = {line[header.index("slurm_job_id")]: line[amount] for line in lines[1:] if line[0] == "job"}
    adjustments = [line[amount] for line in lines[1:] if line[0] == "adjustment"]
    assert by_job["41"] == "0.43" and "-0.43" in adjustments

    again = bill(ledger_db, sacct)

    assert again.credits == 0
    assert len(credits(ledger_db)) == 2
    with ledger_db.sessions() as session:
        assert len(session.scalars(select(WebhookEvent)).all()) == 1
    ledger_db.assert_spend_exact()


def test_a_full_price_job_that_asked_for_requeue_has_its_failed_run_credited_and_its_next_run_billed(
    ledger_db: LedgerDb,
) -> None:
    ledger_db.add_account("acme")
    add_job(ledger_db, "job-45", 45)
    # requeue_on_failure: the check requeued the full-price job (sbatch --requeue), which then completed elsewhere.
    sacct = Sacct([
        (45, "REQUEUED", "2026-11-03T00:00:00", "2026-11-03T01:00:00", "normal", XID_79.comment()),
        (45, "COMPLETED", "2026-11-03T01:02:00", "2026-11-03T01:32:00", "normal", XID_79.comment()),
    ])

    report = bill(ledger_db, sacct)

    assert report.credits == 1
    assert credits(ledger_db) == [
        ("2026-11", -3600 * RTX4090_NANOS, "gpu_failure_credit",
         "automatic credit: job 45 ended by a GPU failure (gpu_failure: Xid 79 on 0000:41:00.0 (node gpu1))"),
    ]
    lines = list(csv.reader(io.StringIO(ledger_db.cli("invoice", "--account", "acme", "--period", "2026-11", "-o", "-").stdout)))
    header = lines[0]
    charged = sorted(line[header.index("amount")] for line in lines[1:] if line[0] == "job")
    adjustments = [line[header.index("amount")] for line in lines[1:] if line[0] == "adjustment"]
    assert charged == ["0.22", "0.43"]  # both runs charged: the failed hour, and the half hour after the requeue
    assert adjustments == ["-0.43"]  # the failed run alone is credited back
    with ledger_db.sessions() as session:
        [event] = session.scalars(select(WebhookEvent)).all()
        job = session.get(Job, "job-45")
        assert job is not None
        # The job went on and completed: no gpu_failure end_reason for what the customer sees last.
        assert job.end_reason is None
    assert event.type == "job.failed"
    assert event.payload["data"]["gpu_failure"]["requeued"] is True
    assert event.payload["data"]["run_started_at"] == "2026-11-03T00:00:00Z"
    ledger_db.assert_spend_exact()


def test_a_run_a_failed_gpu_ended_in_its_first_second_is_charged_nothing_and_its_owner_is_still_told_once(
    ledger_db: LedgerDb,
) -> None:
    ledger_db.add_account("acme")
    add_job(ledger_db, "job-46", 46)
    failure = GpuFailure(reason="Xid 79 on 0000:41:00.0", node="gpu1", gpu="0000:41:00.0", at=utc("2026-11-30T23:59:59"), xid=79)
    # Started and ended in the same second, the month's last: sacct's ElapsedRaw 0, nothing on the ledger.
    sacct = Sacct([(46, "CANCELLED by 0", "2026-11-30T23:59:59", "2026-11-30T23:59:59", "normal", failure.comment())])

    bill(ledger_db, sacct, now="2026-12-01T00:10:00")
    bill(ledger_db, sacct, now="2026-12-01T00:20:00")

    assert credits(ledger_db) == [
        ("2026-11", 0, "gpu_failure_credit",
         "automatic credit: job 46 ended by a GPU failure (gpu_failure: Xid 79 on 0000:41:00.0 (node gpu1))"),
    ]
    with ledger_db.sessions() as session:
        job = session.get(Job, "job-46")
        assert job is not None
        assert job.end_reason == "gpu_failure: Xid 79 on 0000:41:00.0 (node gpu1)"
        [event] = session.scalars(select(WebhookEvent)).all()
    assert event.type == "job.failed" and event.payload["data"]["credited"] == "0.00"
    lines = list(csv.DictReader(io.StringIO(ledger_db.cli("invoice", "--account", "acme", "--period", "2026-11", "-o", "-").stdout)))
    assert [(line["line_type"], line["amount"]) for line in lines if line["line_type"] in ("job", "adjustment")] == [
        ("adjustment", "0.00"),
    ]
    ledger_db.assert_spend_exact()


def test_the_site_can_switch_the_automatic_gpu_credit_off(ledger_db: LedgerDb) -> None:
    ledger_db.add_account("acme")
    sacct = Sacct()

    bill(ledger_db, sacct, billing_credit_gpu_failures=False)

    assert credits(ledger_db) == []
    assert sacct.asked_for_comments == []


def test_an_operator_credits_any_run_by_hand_once_and_audited(ledger_db: LedgerDb) -> None:
    ledger_db.add_account("acme")
    bill(ledger_db, Sacct(), billing_credit_gpu_failures=False)

    first = ledger_db.cli("credit", "run", "44", "--reason", "slow GPU, customer complained")
    second = ledger_db.cli("credit", "run", "44", "--reason", "again")

    assert first.returncode == 0, first.stderr
    assert "-0.072 USD on acme's 2026-11 invoice" in first.stdout
    assert second.returncode == 0 and "credited already" in second.stdout
    assert credits(ledger_db) == [
        ("2026-11", -600 * RTX4090_NANOS, "manual_run_credit", "credit: job 44: slow GPU, customer complained"),
    ]
    with ledger_db.sessions() as session:
        rows = [row for row in audit.events(session, limit=10) if row.action == audit.RUN_CREDIT]
    assert [(row.target, (row.details or {}).get("credited")) for row in rows] == [("44", "0.00"), ("44", "0.072")]
    missing = ledger_db.cli("credit", "run", "999", "--reason", "no such job")
    assert missing.returncode != 0 and "no charge for job '999'" in missing.stderr
    ledger_db.assert_spend_exact()


def node(state: str, flags: list[str], reason: str, at: str | None) -> dict[str, object]:
    changed = int(utc(at).timestamp()) if at else 0
    return {"name": "gpu1", "state": state, "state_flags": flags, "reason": reason, "reason_changed_at": changed}


# Runs that ended on their own around a drain of gpu1 at 06:01:00 (check interval 60 s): only the one that
# failed on gpu1 within the interval before the drain died of the GPU as far as anyone can tell.
AROUND_A_DRAIN = [
    (51, "FAILED", "2026-11-03T05:30:00", "2026-11-03T06:00:30", "normal", ""),  # on gpu1, 30 s before: credited
    (52, "FAILED", "2026-11-03T05:30:00", "2026-11-03T06:00:30", "normal", ""),  # the same, on gpu2: not
    (53, "FAILED", "2026-11-03T05:00:00", "2026-11-03T05:40:00", "normal", ""),  # on gpu1, 21 min before: not
    (54, "COMPLETED", "2026-11-03T05:30:00", "2026-11-03T06:00:40", "normal", ""),  # ended as it meant to: not
    (55, "FAILED", "2026-11-03T06:05:00", "2026-11-03T06:05:30", "normal", ""),  # started after the drain: not
]


@pytest.mark.parametrize(("reason", "credited"), [
    ("gpu: 0000:42:00.0 is lost (fallen off the bus)", True),
    ("gpu: Xid 79 on 0000:41:00.0 (+1 more)", True),
    ("gpu: /dev/nvidia2 missing (gres.conf names it)", True),
    # Not a failed GPU: a hot card still computes; an operator's own drain is the operator's.
    ("gpu: 0000:41:00.0 at 93 C (drain at 90)", False),
    ("gpu: Xid 13 on 0000:41:00.0", False),
    ("fan replaced, Kim", False),
])
def test_a_run_that_failed_just_before_its_node_drained_for_a_failed_gpu_is_credited_once(
    ledger_db: LedgerDb, reason: str, credited: bool,
) -> None:
    ledger_db.add_account("acme")
    add_job(ledger_db, "job-51", 51)
    sacct = Sacct(AROUND_A_DRAIN, on={52: "gpu2"})
    sacct.nodes = [node("mixed", ["DRAIN"], reason, "2026-11-03T06:01:00"), {**node("idle", [], "", None), "name": "gpu2"}]

    report = bill(ledger_db, sacct, gpu_check_interval_s=60)

    cause = reason.removeprefix("gpu: ")
    expected = [("2026-11", -1830 * RTX4090_NANOS, "gpu_failure_credit",
                 f"automatic credit: job 51 failed as a GPU failed under it (gpu_failure: {cause} (node gpu1))")]
    assert credits(ledger_db) == (expected if credited else [])
    assert report.credits == len(credits(ledger_db))
    with ledger_db.sessions() as session:
        job = session.get(Job, "job-51")
        assert job is not None
        assert job.end_reason == (f"gpu_failure: {cause} (node gpu1)" if credited else None)
        failed = session.scalars(select(WebhookEvent).where(WebhookEvent.type == "job.failed")).all()
    assert [event.payload["data"]["gpu_failure"]["at"] for event in failed] == (["2026-11-03T06:01:00Z"] if credited else [])
    # The next pass sees the same runs and the same drain (the overlap): nothing more.
    assert bill(ledger_db, sacct, "2026-11-03T12:05:00", gpu_check_interval_s=60).credits == 0
    assert len(credits(ledger_db)) == len(expected if credited else [])
    ledger_db.assert_spend_exact()


def test_the_automatic_credit_switch_holds_for_runs_that_failed_before_the_check(ledger_db: LedgerDb) -> None:
    ledger_db.add_account("acme")
    sacct = Sacct(AROUND_A_DRAIN, on={52: "gpu2"})
    sacct.nodes = [node("mixed", ["DRAIN"], "gpu: 0000:42:00.0 is lost (fallen off the bus)", "2026-11-03T06:01:00")]

    assert bill(ledger_db, sacct, billing_credit_gpu_failures=False).credits == 0
    assert credits(ledger_db) == []


def test_a_gpu_drain_is_recorded_and_mailed_to_the_operator_once_and_its_end_noted(ledger_db: LedgerDb) -> None:
    ledger_db.add_account("acme")
    sacct = Sacct()
    operator = {
        "smtp_host": "smtp.example.com", "operator_email": "ops@example.com",
        "operator_webhook_url": "https://ops.example.com/gpupool", "operator_webhook_secret": "o" * 32,
    }
    sacct.nodes = [node("mixed", ["DRAIN"], "gpu: Xid 79 on 0000:41:00.0", "2026-11-03T01:00:00"),
                   {**node("idle", [], "", None), "name": "gpu2"}]

    bill(ledger_db, sacct, "2026-11-03T12:00:00", **operator)
    bill(ledger_db, sacct, "2026-11-03T12:05:00", **operator)  # the same drain, seen again
    sacct.nodes = [node("idle", [], "", None)]
    bill(ledger_db, sacct, "2026-11-03T14:00:00", **operator)  # the operator resumed it
    sacct.nodes = [node("down", [], "gpu: nvidia-smi hung (no answer within its timeout)", "2026-11-03T15:00:00")]
    bill(ledger_db, sacct, "2026-11-03T16:00:00")  # drained again; this site has no operator email

    with ledger_db.sessions() as session:
        events = session.execute(
            select(NodeHealthEvent.node, NodeHealthEvent.reason, NodeHealthEvent.drained_at, NodeHealthEvent.resumed_at)
            .order_by(NodeHealthEvent.id)
        ).all()
        mail = session.execute(select(EmailOutbox.account, EmailOutbox.recipient, EmailOutbox.subject, EmailOutbox.body)).all()
    assert [tuple(event) for event in events] == [
        ("gpu1", "gpu: Xid 79 on 0000:41:00.0", utc("2026-11-03T01:00:00"), utc("2026-11-03T14:00:00")),
        ("gpu1", "gpu: nvidia-smi hung (no answer within its timeout)", utc("2026-11-03T15:00:00"), None),
    ]
    with ledger_db.sessions() as session:
        hooks = session.execute(
            select(WebhookEvent.account, WebhookEvent.type, WebhookEvent.payload, WebhookDelivery.endpoint_id)
            .join(WebhookDelivery, WebhookDelivery.event_id == WebhookEvent.id)
        ).all()
    # The operator's webhook: the first drain once, as node.drained; the second drain's site set none.
    [(hook_account, hook_type, payload, endpoint_id)] = hooks
    assert (hook_account, hook_type, endpoint_id) == (None, "node.drained", "operator")
    assert payload["data"] == {"node": {
        "name": "gpu1", "reason": "gpu: Xid 79 on 0000:41:00.0", "drained_at": "2026-11-03T01:00:00Z",
        "resume_with": "gpupool node resume gpu1",
    }}
    validate_event(payload)
    [(account, recipient, subject, body)] = mail
    assert (account, recipient, subject) == (None, "ops@example.com", "gpupool: node gpu1 drained, gpu: Xid 79 on 0000:41:00.0")
    assert "gpupool node resume gpu1" in body

    # The operator report of the day: gpu1's two drains (13 h then 1 h to the report's end) and the two runs the
    # first pass credited (0.432 and 0.216, each rounded to the cent as its invoice line).
    with ledger_db.sessions() as session:
        report = build_report(session, NoCluster(), ledger_db.settings, utc("2026-11-03T00:00:00"), utc("2026-11-04T00:00:00"),  # type: ignore[arg-type]
                              utc("2026-11-03T16:00:00"))
    assert [line.model_dump() for line in report.node_health] == [
        {"node": "gpu1", "drains": 2, "hours_drained": "14.00", "runs_credited": 2, "credited": "0.65"},
    ]


def test_the_sender_posts_the_drain_to_the_operators_receiver_signed_with_the_sites_secret(ledger_db: LedgerDb) -> None:
    ledger_db.add_account("acme")
    sacct = Sacct()
    sacct.nodes = [node("mixed", ["DRAIN"], "gpu: Xid 79 on 0000:41:00.0", "2026-11-03T01:00:00")]
    with serve_webhooks() as receiver:
        # On loopback, which no customer's endpoint may use (webhook_allow_cidrs is empty): the operator's own URL may.
        site = {"operator_webhook_url": receiver.base + "/ops", "operator_webhook_secret": "o" * 32}
        bill(ledger_db, sacct, **site)
        sender = WebhookSender(ledger_db.sessions, ledger_db.settings.replace(**site))
        try:
            assert sender.run_once() == 1
            assert sender.run_once() == 0  # delivered: once per drain
        finally:
            sender.close()
        [delivery] = receiver.at("/ops")
    body = verify_signature(delivery.body, delivery.headers["Gpupool-Signature"], "o" * 32)
    assert (delivery.headers["Gpupool-Event-Type"], body["type"]) == ("node.drained", "node.drained")
    assert body["data"]["node"]["reason"] == "gpu: Xid 79 on 0000:41:00.0"
    with pytest.raises(InvalidSignature):
        verify_signature(delivery.body, delivery.headers["Gpupool-Signature"], "x" * 32)
