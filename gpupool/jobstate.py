"""Job states from Slurm without hammering it.

One batched ``squeue`` for every unfinished job, at most once per refresh
interval across all processes: a single-row lease in the database decides who
runs it, so the number of Slurm calls depends neither on how many clients poll
nor on how many gunicorn workers serve them. Jobs that squeue no longer lists
(past ``MinJobAge``) or that it shows as ended are read from ``sacct``, again in
one call. Jobs whose submission timed out are found by their tag.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from gpupool.db import utcnow
from gpupool.errors import SlurmUnavailable
from gpupool.metrics import REFRESH_PASSES, REFRESH_SECONDS
from gpupool.models import TERMINAL_STATES, Job, SlurmSync
from gpupool.models.jobs import SUBMITTING
from gpupool.render import TAG_PREFIX
from gpupool.slurm import AccountingEntry, QueueEntry, SlurmClient

log = logging.getLogger("gpupool.jobstate")
LEASE_ID = 1
SUBMISSION_LOST = "SubmissionLost"


def _apply_queue(job: Job, entry: QueueEntry) -> None:
    job.slurm_job_id = entry.slurm_job_id
    job.state = entry.state
    job.reason = entry.reason if entry.state == "PENDING" else None
    job.submitted_at = entry.submitted_at or job.submitted_at
    job.started_at = entry.started_at
    job.node = entry.node if entry.state != "PENDING" else None


def _apply_accounting(job: Job, entry: AccountingEntry) -> None:
    job.state = entry.state
    job.reason = entry.reason if entry.state == "PENDING" else None
    job.submitted_at = entry.submitted_at or job.submitted_at
    job.started_at = entry.started_at
    job.ended_at = entry.ended_at if entry.state in TERMINAL_STATES else None
    job.node = entry.node
    if entry.state in TERMINAL_STATES:
        job.finished = True
        job.exit_code = entry.exit_code
        job.exit_signal = entry.exit_signal
        job.elapsed_s = entry.elapsed_s


class JobStateRefresher:
    def __init__(
        self,
        session_factory: sessionmaker,
        slurm: SlurmClient,
        *,
        interval_s: float,
        submission_grace_s: float,
    ) -> None:
        self._sessions = session_factory
        self._slurm = slurm
        self.interval = dt.timedelta(seconds=interval_s)
        self.submission_grace = dt.timedelta(seconds=submission_grace_s)
        # Before this moment the lease is known to be held: skip the database entirely.
        self._not_before = dt.datetime.min.replace(tzinfo=dt.UTC)

    def _claim_lease(self, now: dt.datetime) -> dt.datetime | None:
        """Take the lease (None) or return when its current holder took it."""
        with self._sessions() as session, session.begin():
            claimed = session.execute(
                update(SlurmSync)
                .where(SlurmSync.id == LEASE_ID, SlurmSync.started_at <= now - self.interval)
                .values(started_at=now)
            ).rowcount
            if claimed:
                return None
            lease = session.get(SlurmSync, LEASE_ID)
            if lease is not None:
                return lease.started_at
        try:
            with self._sessions() as session, session.begin():
                session.add(SlurmSync(id=LEASE_ID, started_at=now))
            return None
        except IntegrityError:
            return now  # another process created the lease first and holds it

    def due(self) -> bool:
        """False while this process knows another holds the lease: no database call needed."""
        return utcnow() >= self._not_before

    def maybe_refresh(self) -> bool:
        """Refresh if this interval's lease is free; True if this call ran the refresh."""
        if not self.due():
            return False
        now = utcnow()
        held_since = self._claim_lease(now)
        if held_since is not None:
            self._not_before = held_since + self.interval
            return False
        self._not_before = now + self.interval
        error: str | None = None
        with REFRESH_SECONDS.time():
            try:
                self.refresh(now)
            except SlurmUnavailable as exc:
                # Callers keep serving the last known states; the next lease retries.
                error = exc.message
                log.warning("job state refresh failed: %s", exc.message)
        REFRESH_PASSES.labels(outcome="ok" if error is None else "failed").inc()
        with self._sessions() as session, session.begin():
            session.execute(
                update(SlurmSync).where(SlurmSync.id == LEASE_ID).values(finished_at=utcnow(), last_error=error)
            )
        return True

    def refresh(self, now: dt.datetime | None = None) -> None:
        """Read Slurm once for every unfinished job and store what it says.

        Slurm is asked between two short transactions, never inside one: no
        database transaction waits on squeue or sacct.
        """
        now = now or utcnow()
        with self._sessions() as session:
            rows = session.execute(select(Job.id, Job.slurm_job_id).where(Job.finished.is_(False))).all()
        tracked = {job_id: slurm_id for job_id, slurm_id in rows}
        if not tracked:
            return
        queue = self._slurm.queue()
        by_tag = {entry.comment: entry for entry in queue.values() if entry.comment.startswith(TAG_PREFIX)}
        # squeue no longer lists it (past MinJobAge) or lists it as ended: sacct has the final word.
        ended_or_forgotten = [
            slurm_id
            for slurm_id in tracked.values()
            if slurm_id is not None and (slurm_id not in queue or queue[slurm_id].state in TERMINAL_STATES)
        ]
        records = self._slurm.accounting(ended_or_forgotten)
        with self._sessions() as session, session.begin():
            for job in session.scalars(select(Job).where(Job.id.in_(list(tracked)), Job.finished.is_(False))):
                if job.slurm_job_id is None:
                    self._resolve_submission(job, by_tag.get(job.tag), now)
                    continue
                entry = queue.get(job.slurm_job_id)
                if entry is not None and entry.comment in ("", job.tag):
                    _apply_queue(job, entry)
                record = records.get(job.slurm_job_id)
                if record is not None and (entry is None or entry.state in TERMINAL_STATES):
                    _apply_accounting(job, record)

    def _resolve_submission(self, job: Job, entry: QueueEntry | None, now: dt.datetime) -> None:
        if entry is not None:
            log.info("adopting job %s: Slurm accepted it as %s after sbatch gave up", job.id, entry.slurm_job_id)
            _apply_queue(job, entry)
            return
        attempted = job.submit_attempted_at or job.created_at
        if job.state == SUBMITTING and now - attempted > self.submission_grace:
            job.state, job.reason, job.finished = "FAILED", SUBMISSION_LOST, True
            job.ended_at = now
