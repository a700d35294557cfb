"""Idle GPUs: a running job whose every GPU stays under its policy's threshold for the policy's window.

``gpupool idle check`` runs ``check_idle`` once a minute (a systemd timer). One
pass:

1. asks Slurm once (``scontrol show job --details``) which jobs run and which
   GPU indices each holds on which node (``gpupool.slurm.detail``);
2. scrapes each of those nodes' exporters once (``gpupool.gpu_usage.exporter``)
   and records, for every gpupool job, one ``gpu_samples`` row per GPU it holds;
3. prunes samples older than ``idle_sample_retention_min``;
4. adds each job's idle GPU-seconds of the last hour to ``idle_gpu_hours``
   (``gpupool.gpu_usage.idle_time``: what the operator report's idle GPU-hours
   sum), by the threshold of ``threshold_of``, and commits;
5. judges each job against its policy (``policy_for``: the account's, else the
   template's, else the settings' default) with ``judge``, a pure function;
6. acts on the verdict (``next_step``): the first pass that finds a job idle
   sends ``job.idle`` (a signed webhook to the endpoints that want it, and an
   email to the account's alert address when the operator has an SMTP server),
   and a pass ``grace_min`` after that, when the policy says cancel and the job
   is still idle, cancels it as its tenant and says why in ``end_reason``.

A pass runs alone: it holds a PostgreSQL advisory lock (``gpupool.db.locks``)
from before it reads the jobs until its last commit, so two passes at once (a
timer on two API hosts, a slow pass and the next) do not both do the work; the
second finds the lock held and does nothing (``CheckResult.skipped``). SQLite
has no such lock (``locks.alone``), and there two passes can both decide, each
from the rows it read at its start. So the notice and the cancel are each
claimed on the job's row (``_claim``: an UPDATE that only changes a row where
``idle_notified_at``, or ``idle_cancelled_at``, is still NULL), and only the
pass whose UPDATE changed the row sends job.idle or cancels: once, on any
database.

``scontrol``'s answer holds every tenant's free text, so a running record is
believed for a gpupool job only when its account is the job's, its user the one
the job was submitted as (its member's own, or that account's tenant user), and it names as many GPUs as the job holds
(``record_doubt``; ``gpupool.slurm.detail`` already drops a job id printed
twice). A record that fails is logged, and the job is neither sampled nor
judged in that pass.

Session jobs (JupyterLab, web apps) are judged like any job: a session whose
GPUs idle through the window gets job.idle however busy its browser tab, and
the cancel ends the session too (``job_sessions.idle_stopped_at``), so the
proxy stops serving it at once and the session sweep leaves it alone. A job
the session sweep already stopped is not cancelled a second time.

A job that gets busy again is re-armed: its next idle spell sends job.idle
again and starts a new grace. A GPU the exporter did not report, a sample
without a utilization, or a gap of more than ``MAX_GAP`` between samples
(exporter down, checks not running) is not evidence of idleness: the job is
judged idle only on samples that cover the whole window.

Array jobs are not judged yet (their tasks are Slurm jobs of their own).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.db.locks import IDLE_CHECK, alone
from gpupool.errors import CommandFailed, GpupoolError
from gpupool.gpu_usage.exporter import NodeMetrics, scrape_cluster
from gpupool.gpu_usage.idle_time import recount, recount_from, store_idle_hours
from gpupool.gpu_usage.samples import MAX_GAP, GpuKey, Reading, is_under
from gpupool.models import AlertSettings, EmailOutbox, Job, JobSession
from gpupool.models.alerts import EMAIL_PENDING
from gpupool.models.gpu_usage import ACCOUNT, TEMPLATE, GpuSample, IdlePolicy
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.detail import RunningJob
from gpupool.slurm.tenants import tenant_user_name
from gpupool.webhooks.events import JOB_IDLE
from gpupool.webhooks.outbox import enqueue_job_event

log = logging.getLogger("gpupool.idle")

# What GET /jobs/<id> shows per GPU: the latest samples, oldest first.
RECENT_SAMPLES_PER_GPU = 60
MAX_GPUS_SHOWN = 16

Scrape = Callable[[Iterable[str], Settings], Mapping[str, NodeMetrics]]

NOTIFY = "notify"
CANCEL = "cancel"
REARM = "rearm"


@dataclass(frozen=True)
class Policy:
    """After ``window_min`` minutes under ``threshold_pct`` on every GPU: job.idle; ``grace_min`` later, maybe cancel."""

    window_min: int
    threshold_pct: int
    grace_min: int
    cancel: bool
    source: str  # "account <name>", "template <name>" or "default"

    def as_dict(self) -> dict[str, Any]:
        return {
            "window_min": self.window_min, "threshold_pct": self.threshold_pct, "grace_min": self.grace_min,
            "cancel": self.cancel, "source": self.source,
        }


@dataclass(frozen=True)
class Verdict:
    idle: bool
    # Since when every GPU has been under the threshold, as far as the samples show; None: some GPU is not.
    under_since: dt.datetime | None


def under_since(readings: Sequence[Reading], threshold_pct: float, now: dt.datetime, max_gap: dt.timedelta = MAX_GAP) -> dt.datetime | None:
    """The earliest moment from which one GPU's samples, up to ``now``, are all under the threshold with no gap."""
    since = None
    later = now
    for reading in sorted(readings, key=lambda reading: reading.at, reverse=True):
        if reading.at > now:
            continue
        if later - reading.at > max_gap:
            break
        if not is_under(reading, threshold_pct):
            break
        since = later = reading.at
    return since


def judge(
    samples: Mapping[GpuKey, Sequence[Reading]],
    gpus: Iterable[GpuKey],
    policy: Policy,
    now: dt.datetime,
    max_gap: dt.timedelta = MAX_GAP,
) -> Verdict:
    """Idle when every one of the job's ``gpus`` has been under the threshold for the whole window.

    Pure: the samples (per GPU, any order) and the moment of judgement decide.
    A job with no GPUs, or a policy with a window of 0, is never idle.
    """
    wanted = sorted(set(gpus))
    if not wanted or policy.window_min <= 0:
        return Verdict(False, None)
    starts = [under_since(samples.get(gpu, ()), policy.threshold_pct, now, max_gap) for gpu in wanted]
    if any(start is None for start in starts):
        return Verdict(False, None)
    since = max(start for start in starts if start is not None)
    return Verdict(now - since >= dt.timedelta(minutes=policy.window_min), since)


def busy_at(samples: Mapping[GpuKey, Sequence[Reading]], threshold_pct: float) -> dt.datetime | None:
    """The latest moment any of the GPUs was at or over the threshold, by the samples; None: never.

    Pure. A sample without a utilization is no evidence either way.
    """
    return max(
        (reading.at for readings in samples.values() for reading in readings
         if reading.utilization_pct is not None and not is_under(reading, threshold_pct)),
        default=None,
    )


def next_step(verdict: Verdict, policy: Policy, notified_at: dt.datetime | None, cancelled_at: dt.datetime | None, now: dt.datetime) -> str | None:
    """What a pass does with a judged job: notify, cancel, re-arm (busy again after a notice) or nothing."""
    if cancelled_at is not None:
        return None
    if not verdict.idle:
        return REARM if notified_at is not None else None
    if notified_at is None:
        return NOTIFY
    if policy.cancel and now - notified_at >= dt.timedelta(minutes=policy.grace_min):
        return CANCEL
    return None


def threshold_of(policy: Policy | None, settings: Settings) -> int:
    """The utilization under which a job's GPU counts as idle: its policy's (whatever the window), else the default."""
    return settings.idle_threshold_pct if policy is None else policy.threshold_pct


def default_policy(settings: Settings) -> Policy | None:
    if settings.idle_window_min <= 0:
        return None
    return Policy(settings.idle_window_min, settings.idle_threshold_pct, settings.idle_grace_min, settings.idle_cancel, "default")


def _policy(row: IdlePolicy) -> Policy:
    return Policy(row.window_min, row.threshold_pct, row.grace_min, row.cancel, f"{row.scope} {row.name}")


def policy_for(session: Session, settings: Settings, account: str, template: str) -> Policy | None:
    """The account's policy, else the template's, else the settings' default; None: not judged."""
    rows = {
        row.scope: row
        for row in session.scalars(
            select(IdlePolicy).where(
                ((IdlePolicy.scope == ACCOUNT) & (IdlePolicy.name == account))
                | ((IdlePolicy.scope == TEMPLATE) & (IdlePolicy.name == template))
            )
        )
    }
    for scope in (ACCOUNT, TEMPLATE):
        if scope in rows:
            return _policy(rows[scope])
    return default_policy(settings)


def set_policy(
    session: Session, scope: str, name: str, *, window_min: int, threshold_pct: int, grace_min: int, cancel: bool, now: dt.datetime
) -> IdlePolicy:
    """Create or replace one policy, in the caller's transaction; ValueError for values out of range."""
    if scope not in (ACCOUNT, TEMPLATE):
        raise ValueError(f"scope is account or template, not {scope!r}")
    if window_min < 0 or grace_min < 0:
        raise ValueError("window and grace are 0 minutes or more")
    if not 0 <= threshold_pct <= 100:
        raise ValueError("the threshold is a percentage from 0 to 100")
    row = session.scalars(select(IdlePolicy).where(IdlePolicy.scope == scope, IdlePolicy.name == name)).first()
    if row is None:
        row = IdlePolicy(scope=scope, name=name)
        session.add(row)
    row.window_min, row.threshold_pct, row.grace_min, row.cancel, row.updated_at = window_min, threshold_pct, grace_min, cancel, now
    return row


def cancel_reason(policy: Policy) -> str:
    """What the customer reads as the job's end_reason."""
    return (
        f"idle: every GPU under {policy.threshold_pct}% for {policy.window_min} min, "
        f"still idle {policy.grace_min} min after the job.idle notice; gpupool cancelled it ({policy.source} idle policy)"
    )


@dataclass
class CheckResult:
    # Another pass held the lock: this one did nothing.
    skipped: bool = False
    jobs: int = 0
    samples: int = 0
    pruned: int = 0
    notified: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    rearmed: list[str] = field(default_factory=list)
    # Jobs whose scontrol record was not believed (record_doubt): neither sampled nor judged.
    doubted: list[str] = field(default_factory=list)
    node_errors: dict[str, str] = field(default_factory=dict)


def _gpus_of(running: RunningJob) -> list[GpuKey]:
    return sorted({(alloc.node, index) for alloc in running.gpus for index in alloc.indices})


def record_doubt(record: RunningJob, job: Job, tenant_user: str) -> str | None:
    """Why scontrol's running ``record`` is not believed for ``job`` (None: it is), ``tenant_user`` the job account's.

    Pure. ``job.gpus`` is all the job holds: gpupool submits every job to one
    node (``gpupool.render.sbatch_options``), so GPUs per node times nodes is it.
    """
    if record.account != job.account or record.user != tenant_user:
        return f"it is {record.user}'s under account {record.account}, not {tenant_user}'s under {job.account}"
    named = len(_gpus_of(record))
    if named != job.gpus:
        return f"it names {named} GPU(s), the job holds {job.gpus}"
    return None


def _believed(jobs: Sequence[Job], running: Mapping[int, RunningJob], settings: Settings, result: CheckResult) -> list[Job]:
    kept = []
    for job in jobs:
        assert job.slurm_job_id is not None
        # The user the job was submitted as: its member's own, or the account's.
        doubt = record_doubt(running[job.slurm_job_id], job, job.unix_user or tenant_user_name(settings, job.account))
        if doubt is None:
            kept.append(job)
        else:
            log.warning("job %s (Slurm %s): scontrol's record not believed, skipped this pass: %s", job.id, job.slurm_job_id, doubt)
            result.doubted.append(job.id)
    return kept


def _record(session: Session, job: Job, gpus: Sequence[GpuKey], metrics: Mapping[str, NodeMetrics], now: dt.datetime) -> int:
    rows = []
    for node, index in gpus:
        scraped = metrics.get(node)
        reading = scraped.gpus.get(index) if scraped is not None and scraped.error is None else None
        if reading is not None:
            rows.append(
                GpuSample(
                    job_id=job.id, sampled_at=now, node=node, gpu_index=index,
                    utilization_pct=reading.utilization_pct, memory_used_mib=reading.memory_used_mib,
                )
            )
    session.add_all(rows)
    return len(rows)


def _readings(session: Session, job_id: str, since: dt.datetime) -> dict[GpuKey, list[Reading]]:
    found: dict[GpuKey, list[Reading]] = {}
    for node, index, at, utilization in session.execute(
        select(GpuSample.node, GpuSample.gpu_index, GpuSample.sampled_at, GpuSample.utilization_pct).where(
            GpuSample.job_id == job_id, GpuSample.sampled_at >= since
        )
    ):
        found.setdefault((node, index), []).append(Reading(at, utilization))
    return found


def last_busy_at(session: Session, settings: Settings, job: Job, since: dt.datetime) -> tuple[dt.datetime | None, int]:
    """When the job's GPUs were last busy (at or over its idle threshold) since ``since``, and that threshold."""
    threshold = threshold_of(policy_for(session, settings, job.account, job.template), settings)
    return busy_at(_readings(session, job.id, since), threshold), threshold


def _notice_data(policy: Policy, verdict: Verdict, gpus: Sequence[GpuKey], now: dt.datetime) -> dict[str, Any]:
    cancel_at = now + dt.timedelta(minutes=policy.grace_min) if policy.cancel else None
    return {
        "idle": {
            "since": None if verdict.under_since is None else utc_text(verdict.under_since),
            "policy": policy.as_dict(),
            "cancel_after": None if cancel_at is None else utc_text(cancel_at),
            "gpus": [{"node": node, "index": index} for node, index in gpus],
        }
    }


def email_text(job: Job, policy: Policy, verdict: Verdict, now: dt.datetime) -> tuple[str, str]:
    """Subject and body of the job.idle email: the job's own words (name, ids) only as data."""
    subject = f"gpupool: job {job.id} of account {job.account} has idle GPUs"
    since = "" if verdict.under_since is None else f" since {utc_text(verdict.under_since)}"
    then = (
        f"Unless its GPUs get busy, gpupool cancels it at {utc_text(now + dt.timedelta(minutes=policy.grace_min))}.\n"
        if policy.cancel
        else "gpupool does not cancel it; it is billed while it runs.\n"
    )
    body = (
        f"Job {job.id} (Slurm job {job.slurm_job_id}, template {job.template}) of account {job.account} "
        f"has used under {policy.threshold_pct}% of every one of its {job.gpus} GPU(s){since} "
        f"({policy.window_min} min or more).\n{then}"
    )
    return subject, body


def _claim(session: Session, job: Job, values: Mapping[str, Any], *unset: str) -> bool:
    """Write ``values`` to the job's row if each of its ``unset`` columns is still NULL there; whether it did.

    The database decides, not the row this pass read: of two passes that both
    read NULL, one UPDATE changes the row and the other finds it changed (on
    PostgreSQL it waits for the first to commit, then reads the row again). The
    claim is in the pass's transaction, so a rollback lets go of it.
    """
    claimed = session.execute(
        update(Job)
        .where(Job.id == job.id, *(getattr(Job, column).is_(None) for column in unset))
        .values(dict(values))
        .execution_options(synchronize_session=False)
    )
    if getattr(claimed, "rowcount", 0) != 1:
        return False
    for column, value in values.items():
        set_committed_value(job, column, value)  # what the row holds now, with nothing left to flush
    return True


def _notify(session: Session, settings: Settings, job: Job, policy: Policy, verdict: Verdict, gpus: Sequence[GpuKey], now: dt.datetime) -> None:
    enqueue_job_event(session, job, JOB_IDLE, now, _notice_data(policy, verdict, gpus, now))
    alert = session.get(AlertSettings, job.account)
    if settings.smtp_host and alert is not None and alert.email:
        subject, body = email_text(job, policy, verdict, now)
        # No RETURNING: the API's role may add mail to the outbox but never read it (gpupool.db.roles).
        session.execute(
            insert(EmailOutbox).values(
                account=job.account, recipient=alert.email, subject=subject, body=body, state=EMAIL_PENDING,
                attempts=0, next_attempt_at=now, created_at=now,
            )
        )


def _end_session(session: Session, job: Job, now: dt.datetime) -> None:
    """A session job cancelled for idle GPUs is over for its proxy and page now, and the session sweep leaves it be."""
    record = session.get(JobSession, job.id)
    if record is not None and record.idle_stopped_at is None:
        record.idle_stopped_at = now


def _cancel(slurm: SlurmClient, job: Job) -> bool:
    assert job.slurm_job_id is not None
    try:
        slurm.cancel(job.slurm_job_id, job.account, user=job.unix_user)
    except CommandFailed as exc:
        if "Invalid job id" not in exc.stderr and "already completing or completed" not in exc.stderr:
            log.warning("idle job %s: scancel failed: %s", job.id, exc.message)
            return False
    except GpupoolError as exc:
        log.warning("idle job %s: scancel failed: %s", job.id, exc.message)
        return False
    return True


def check_idle(session: Session, settings: Settings, slurm: SlurmClient, now: dt.datetime, scrape: Scrape = scrape_cluster) -> CheckResult:
    """One pass (see the module docstring), or none while another holds the lock; commits what it recorded and decided."""
    with alone(session, IDLE_CHECK) as first:
        if not first:
            log.info("another idle check pass holds the lock: this one does nothing")
            return CheckResult(skipped=True)
        return _check(session, settings, slurm, now, scrape)


def _check(session: Session, settings: Settings, slurm: SlurmClient, now: dt.datetime, scrape: Scrape) -> CheckResult:
    result = CheckResult()
    running = {job.slurm_job_id: job for job in slurm.running_gpu_jobs()}
    found = (
        session.scalars(
            select(Job).where(Job.slurm_job_id.in_(sorted(running)), Job.finished.is_(False), Job.array_size.is_(None))
        ).all()
        if running
        else []
    )
    jobs = _believed(found, running, settings, result)
    held = {job.id: _gpus_of(running[job.slurm_job_id]) for job in jobs if job.slurm_job_id is not None}
    metrics = scrape({node for gpus in held.values() for node, _ in gpus}, settings)
    result.node_errors = {node: found.error for node, found in metrics.items() if found.error is not None}
    for job in jobs:
        result.samples += _record(session, job, held[job.id], metrics, now)
    result.jobs = len(jobs)
    session.flush()
    retention = dt.timedelta(minutes=settings.idle_sample_retention_min)
    pruned = session.execute(delete(GpuSample).where(GpuSample.sampled_at < now - retention))
    result.pruned = int(getattr(pruned, "rowcount", 0) or 0)

    judged: list[tuple[Job, Policy | None, dict[GpuKey, list[Reading]]]] = []
    for job in jobs:
        policy = policy_for(session, settings, job.account, job.template)
        since = recount_from(now)
        if policy is not None:
            since = min(since, now - dt.timedelta(minutes=policy.window_min) - MAX_GAP)
        readings = _readings(session, job.id, since)
        store_idle_hours(session, job.id, recount(readings, threshold_of(policy, settings), now))
        judged.append((job, policy, readings))
    session.commit()

    for job, policy, readings in judged:
        if policy is None:
            continue
        gpus = held[job.id]
        verdict = judge(readings, gpus, policy, now)
        step = next_step(verdict, policy, job.idle_notified_at, job.idle_cancelled_at, now)
        job.idle_since = verdict.under_since if verdict.idle else None
        if step == NOTIFY:
            if _claim(session, job, {"idle_notified_at": now}, "idle_notified_at"):
                log.info("job %s (Slurm %s) idle since %s: job.idle sent", job.id, job.slurm_job_id, verdict.under_since)
                _notify(session, settings, job, policy, verdict, gpus, now)
                result.notified.append(job.id)
            else:
                log.info("job %s (Slurm %s): another pass sent job.idle first", job.id, job.slurm_job_id)
        elif step == REARM:
            job.idle_notified_at = None
            result.rearmed.append(job.id)
        elif step == CANCEL and job.end_reason is None:  # else gpupool ended it already (an idle session), and said why
            # Claimed before scancel and kept only if scancel succeeds; end_reason in the claim too, in case the
            # session sweep ended the job since this pass read it.
            values = {"idle_cancelled_at": now, "end_reason": cancel_reason(policy)}
            if not _claim(session, job, values, "idle_cancelled_at", "end_reason"):
                log.info("job %s (Slurm %s): another pass ended it first", job.id, job.slurm_job_id)
            else:
                log.info("job %s (Slurm %s) idle past its grace: cancelling it as its tenant", job.id, job.slurm_job_id)
                if not _cancel(slurm, job):
                    session.rollback()  # the claim too: a later pass tries again
                    continue
                _end_session(session, job, now)
                result.cancelled.append(job.id)
        session.commit()  # each job's decision stands on its own: a cancel is never left unrecorded by a later one
    return result


def recent_usage(session: Session, job: Job) -> list[dict[str, Any]]:
    """GET /jobs/<id>'s ``gpu_usage.gpus``: per GPU, its latest samples (at most RECENT_SAMPLES_PER_GPU), oldest first."""
    keys = session.execute(
        select(GpuSample.node, GpuSample.gpu_index).where(GpuSample.job_id == job.id).distinct()
        .order_by(GpuSample.node, GpuSample.gpu_index).limit(MAX_GPUS_SHOWN)
    ).all()
    shown = []
    for node, index in keys:
        rows = session.execute(
            select(GpuSample.sampled_at, GpuSample.utilization_pct, GpuSample.memory_used_mib)
            .where(GpuSample.job_id == job.id, GpuSample.node == node, GpuSample.gpu_index == index)
            .order_by(GpuSample.sampled_at.desc())
            .limit(RECENT_SAMPLES_PER_GPU)
        ).all()
        shown.append(
            {
                "node": node,
                "index": index,
                "samples": [
                    {"at": utc_text(at), "utilization_pct": utilization, "memory_used_mib": memory}
                    for at, utilization, memory in reversed(rows)
                ],
            }
        )
    return shown
