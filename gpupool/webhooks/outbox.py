"""Enqueueing webhook events: each with one delivery row per endpoint that wants it, in the caller's transaction.

The refresher notes each job before it applies Slurm's answer (``JobEvents``)
and enqueues ``job.started`` / ``job.preempted`` / ``job.ended`` after, in the
same transaction as the new state: an event exists exactly when its state
change was stored. ``enqueue_job_event`` does the same for one event another
pass decides on (``job.idle``). A ``job.ended`` that some endpoint wants says
how many files the job left at the top of its output folder
(``output_files``): one listing by the run-as helper, as the job's user,
capped in names and in jobs per pass, so the refresh stays short; null when
it could not be counted. The sender (``gpupool.webhooks.sender``)
delivers them; nothing here waits on a receiver.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.errors import GpupoolError, NotFound
from gpupool.models import Job, LedgerEntry
from gpupool.models.webhooks import PENDING, WebhookDelivery, WebhookEndpoint, WebhookEvent
from gpupool.storage.client import StorageClient
from gpupool.storage.paths import StoragePath
from gpupool.webhooks.events import JOB_ENDED, JOB_PREEMPTED, JOB_STARTED

log = logging.getLogger("gpupool.webhooks.outbox")

_PREEMPTED = "PREEMPTED"
# The most names one count lists: output_files is at most this.
OUTPUT_FILES_CAP = 1000
# The most jobs one refresh counts the outputs of, inside its transaction; the rest say null.
OUTPUT_COUNTS_PER_PASS = 20
# How many files a job left at the top of its output folder; None when that could not be learned.
OutputCounter = Callable[[Job], int | None]


def output_counter(settings: Settings) -> OutputCounter:
    """Counts with one ``outputs.get`` of the folder's top (as ``GET /jobs/<id>/outputs/?limit=1000``), read as the job's user."""
    storage = StorageClient(settings)

    def count(job: Job) -> int | None:
        try:
            answer = storage.output_get(job.account, job.id, StoragePath((), True), limit=OUTPUT_FILES_CAP)
        except NotFound:
            return 0  # the job made no output folder (it never ran its script)
        answer.close()  # a folder's listing carries no descriptor; never keep one that came
        entries = answer.facts.get("entries", [])
        return sum(1 for entry in entries if entry.get("type") == "file")

    return count


def _timestamp(value: dt.datetime | None) -> str | None:
    # "auto": microseconds where the moment has them, as payloads have always carried.
    return None if value is None else utc_text(value, timespec="auto")


def _job_payload(session: Session, job: Job, event_type: str, output_files: int | None = None) -> dict[str, Any]:
    gpu_seconds = None
    if event_type == JOB_ENDED:
        # Billed only if a billing pass has already run since the end; usually not yet.
        gpu_seconds = session.scalar(select(func.sum(LedgerEntry.gpu_seconds)).where(LedgerEntry.gpupool_job_id == job.id))
    return {
        "job_id": job.id,
        "account": job.account,
        "name": job.name,
        "template": job.template,
        "state": job.state,
        "slurm_job_id": job.slurm_job_id,
        "gpus": job.gpus,
        "gpu_type": job.gpu_type,
        "node": job.node,
        "submitted_at": _timestamp(job.submitted_at),
        "started_at": _timestamp(job.started_at),
        "ended_at": _timestamp(job.ended_at),
        "exit_code": job.exit_code,
        "exit_signal": job.exit_signal,
        "elapsed_s": job.elapsed_s,
        "end_reason": job.end_reason,
        "preemptible": job.preemptible,
        "run_count": job.run_count,
        "gpu_seconds": None if gpu_seconds is None else int(gpu_seconds),
        "output_files": output_files,
    }


def _preempted(job: Job) -> bool:
    """A spot job between runs: preempted, requeued, not yet running again (gpupool.jobstate)."""
    return job.state == _PREEMPTED and not job.finished


@dataclass(frozen=True)
class _Before:
    """A job as the refresher found it, before Slurm's answer was applied."""

    job: Job
    started: bool
    finished: bool
    preempted: bool
    runs: int

    def events(self) -> list[str]:
        """What happened since, in order."""
        job = self.job
        happened: list[str] = []
        if self.started and job.started_at is not None and (job.run_count or 0) > self.runs:
            # Requeued and started again between two refreshes, so PREEMPTED was never seen:
            # each run still gets its job.started, and a spot job's requeue its job.preempted.
            if job.preemptible and not self.preempted:
                happened.append(JOB_PREEMPTED)
            happened.append(JOB_STARTED)
        for event_type, now_true, before in (
            (JOB_STARTED, job.started_at is not None, self.started),
            (JOB_PREEMPTED, _preempted(job), self.preempted),
            (JOB_ENDED, job.finished, self.finished),
        ):
            if now_true and not before:
                happened.append(event_type)
        return happened


class JobEvents:
    """What the refresher changed: ``note`` each job before applying Slurm's answer, ``enqueue`` after.

    ``count_outputs`` (``output_counter``) fills a ``job.ended``'s ``output_files``; without it, null.
    """

    def __init__(self, count_outputs: OutputCounter | None = None) -> None:
        self._before: list[_Before] = []
        self._count_outputs = count_outputs
        self._counts_left = OUTPUT_COUNTS_PER_PASS

    def _output_files(self, job: Job) -> int | None:
        """One count, while this pass has counts left and the helper has not failed in it."""
        if self._count_outputs is None or self._counts_left <= 0:
            return None
        self._counts_left -= 1
        try:
            return self._count_outputs(job)
        except GpupoolError as exc:
            # The helper is unwell or refuses: the rest of the pass does not wait on it again.
            self._counts_left = 0
            log.warning("output files of job %s not counted for job.ended: %s", job.id, exc.message)
            return None

    def note(self, job: Job) -> None:
        self._before.append(_Before(job, job.started_at is not None, job.finished, _preempted(job), job.run_count or 0))

    def enqueue(self, session: Session, now: dt.datetime) -> int:
        """Add the events and their deliveries to ``session``'s transaction; how many events."""
        happened = [(before.job, event_type) for before in self._before for event_type in before.events()]
        if not happened:
            return 0  # the usual case: no query at all
        accounts = {job.account for job, _ in happened}
        job_ids = {job.id for job, _ in happened}
        endpoints = session.scalars(
            select(WebhookEndpoint).where(
                WebhookEndpoint.account.in_(accounts),
                WebhookEndpoint.deleted_at.is_(None),
                WebhookEndpoint.job_id.is_(None) | WebhookEndpoint.job_id.in_(job_ids),
            )
        ).all()
        owed: list[tuple[str, WebhookEndpoint]] = []
        for job, event_type in happened:
            wanting = [e for e in endpoints if e.account == job.account and e.job_id in (None, job.id) and e.wants(event_type)]
            if not wanting:
                continue
            event_id = f"evt_{uuid.uuid4().hex}"
            output_files = self._output_files(job) if event_type == JOB_ENDED else None
            data = {"job": _job_payload(session, job, event_type, output_files)}
            payload = {"id": event_id, "type": event_type, "created_at": _timestamp(now), "data": data}
            session.add(WebhookEvent(id=event_id, account=job.account, job_id=job.id, type=event_type, payload=payload, created_at=now))
            owed.extend((event_id, endpoint) for endpoint in wanting)
        # The models declare no relationships, so the events go in first, by hand, for the deliveries' foreign key.
        session.flush()
        session.add_all(
            WebhookDelivery(event_id=event_id, endpoint_id=endpoint.id, state=PENDING, attempts=0, next_attempt_at=now)
            for event_id, endpoint in owed
        )
        return len({event_id for event_id, _ in owed})


def enqueue_job_event(session: Session, job: Job, event_type: str, now: dt.datetime, data: dict[str, Any]) -> int:
    """One event about ``job`` (its payload's ``job`` plus ``data``) for each endpoint that wants it; how many deliveries.

    In the caller's transaction, as ``JobEvents.enqueue`` does for the refresher's events.
    """
    wanting = [
        endpoint
        for endpoint in session.scalars(
            select(WebhookEndpoint).where(
                WebhookEndpoint.account == job.account,
                WebhookEndpoint.deleted_at.is_(None),
                WebhookEndpoint.job_id.is_(None) | (WebhookEndpoint.job_id == job.id),
            )
        )
        if endpoint.wants(event_type)
    ]
    if not wanting:
        return 0
    event_id = f"evt_{uuid.uuid4().hex}"
    payload = {
        "id": event_id, "type": event_type, "created_at": _timestamp(now),
        "data": {"job": _job_payload(session, job, event_type), **data},
    }
    session.add(WebhookEvent(id=event_id, account=job.account, job_id=job.id, type=event_type, payload=payload, created_at=now))
    session.flush()  # the event before its deliveries' foreign key
    session.add_all(
        WebhookDelivery(event_id=event_id, endpoint_id=endpoint.id, state=PENDING, attempts=0, next_attempt_at=now)
        for endpoint in wanting
    )
    return len(wanting)
