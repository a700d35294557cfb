"""Job states from Slurm without hammering it.

One batched ``squeue`` for every unfinished job, at most once per refresh
interval across all processes: a single-row lease in the database decides who
runs it, so the number of Slurm calls depends neither on how many clients poll
nor on how many gunicorn workers serve them. Jobs that squeue no longer lists
(past ``MinJobAge``) or that it shows as ended are read from ``sacct``, again in
one call. Every row comes from a query of every tenant's jobs, so a row counts
for a job only when it names that job, the job's own account and the user it
was submitted as (``SlurmClient.owns``: the member's own, or the account's
tenant user); ``SlurmClient.queue`` says why no comment can forge one.
Jobs whose submission timed out are found by their tag. A job neither answers
for in ``unknown_after_s`` is marked ``UNKNOWN`` and no longer tracked.

An array job's tasks come from the same two calls: squeue prints a task as
``<array id>_<index>`` and the tasks still pending as one ``<array id>_[5-19%2]``
row, sacct names each task's row in its JobID (``gpupool.slurm.parse.parse_array_job_id``).
Each task's state is kept in ``job_tasks``; the job's own state is made from them
(``array_state``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.db import database_now, utcnow
from gpupool.errors import SlurmUnavailable
from gpupool.metrics import REFRESH_PASSES, REFRESH_SECONDS
from gpupool.models import TERMINAL_STATES, Job, JobTask, SlurmSync
from gpupool.models.jobs import SUBMITTING, UNKNOWN
from gpupool.render import TAG_PREFIX, job_tag
from gpupool.slurm.client import AccountingEntry, JobRows, QueueEntry, SlurmClient
from gpupool.webhooks.outbox import JobEvents, OutputCounter

log = logging.getLogger("gpupool.jobstate")
LEASE_ID = 1
SUBMISSION_LOST = "SubmissionLost"
NOT_REPORTED = "NotReportedBySlurm"
# An array task Slurm dropped from the array's pending record (Slurm 22.05's scancel of a task
# that never started): no row of its own is ever made, so sacct has nothing more to say.
REMOVED_WHILE_PENDING = "RemovedWhilePending"

# Slurm's word for a preempted run; for a spot job gpupool's word for the wait before its next run.
PREEMPTED = "PREEMPTED"


# A job as the refresher reads it: a row of these columns before Slurm is asked, the
# ORM object when it is written. Whatever Slurm's answer would change is computed from
# either by the same code, so only the rows it changes are ever loaded as objects.
_READ_COLUMNS = (
    Job.id, Job.account, Job.slurm_job_id, Job.state, Job.reason, Job.submitted_at, Job.started_at, Job.ended_at,
    Job.node, Job.finished, Job.exit_code, Job.exit_signal, Job.elapsed_s, Job.last_seen_at, Job.updated_at,
    Job.submit_attempted_at, Job.created_at, Job.expected_start_at, Job.array_size, Job.preemptible, Job.run_count,
    Job.task_states, Job.unix_user,
)
_TASK_COLUMNS = (
    JobTask.job_id, JobTask.task_index, JobTask.slurm_job_id, JobTask.state, JobTask.finished, JobTask.reason,
    JobTask.exit_code, JobTask.exit_signal, JobTask.node, JobTask.started_at, JobTask.ended_at, JobTask.elapsed_s,
)
TrackedTask = JobTask | Row[Any]
TrackedJob = Job | Row[Any]
# Above this many changed rows the write phase reads every unfinished job rather than list their ids.
_LOAD_BY_ID_MAX = 1000


@dataclass(frozen=True)
class SlurmAnswers:
    """What squeue and sacct said in one refresh, rows of every tenant's jobs."""

    queue: Mapping[int, QueueEntry]
    accounting: Mapping[int, AccountingEntry]
    # Queue entries by (account, user, tag), for jobs whose sbatch never returned an id.
    by_tag: Mapping[tuple[str, str, str], QueueEntry]
    # An array job's tasks as they will be once written: job id -> task index -> (state, values).
    tasks: Mapping[str, Mapping[int, TaskView]] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class TaskView:
    """An array task's columns after this refresh, and those that change (empty: none)."""

    state: str
    finished: bool
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    exit_code: int | None
    exit_signal: int | None
    reason: str | None
    node: str | None
    changes: Mapping[str, Any]
    answered: bool


_TASK_VIEW_COLUMNS = ("state", "finished", "started_at", "ended_at", "exit_code", "exit_signal", "reason", "node")


def task_states(states: list[str]) -> dict[str, int]:
    """How many tasks are in each state, keyed in order (the row's JSON compares equal run to run)."""
    return dict(sorted(Counter(states).items()))


def array_state(states: list[str]) -> str:
    """An array job's state from its tasks': RUNNING while any runs, PENDING while any waits,
    then COMPLETED if all completed, else the state of the first task (by index) that did not."""
    if any(state not in TERMINAL_STATES and state not in ("PENDING", UNKNOWN) for state in states):
        return "RUNNING"
    if any(state == "PENDING" for state in states):
        return "PENDING"
    return next((state for state in states if state != "COMPLETED"), "COMPLETED")


# squeue's START_TIME is the run's start only while the job runs (or is suspended): for a
# pending job it is an estimate, and while a requeued job completes it is the current
# second, a new value every second (seen on 22.05), which would count a new run at each
# refresh. Otherwise the start already stored stands; sacct's record of a finished run has
# the last word.
_RUN_START_STATES = frozenset({"RUNNING", "SUSPENDED"})


def _queue_start(entry: QueueEntry) -> dict[str, Any]:
    if entry.state == "PENDING":
        return {"started_at": None}
    if entry.state in _RUN_START_STATES:
        return {"started_at": entry.started_at}
    return {}


def _queue_values(entry: QueueEntry, submitted_at: dt.datetime | None) -> dict[str, Any]:
    return {
        "slurm_job_id": entry.slurm_job_id,
        "state": entry.state,
        "reason": entry.reason if entry.state == "PENDING" else None,
        "submitted_at": entry.submitted_at or submitted_at,
        **_queue_start(entry),
        "node": entry.node if entry.state != "PENDING" else None,
        # From the same squeue row (its %S): an estimate costs no Slurm call of its own.
        "expected_start_at": entry.expected_start if entry.state == "PENDING" else None,
    }


def _accounting_values(entry: AccountingEntry, submitted_at: dt.datetime | None) -> dict[str, Any]:
    values: dict[str, Any] = {
        "state": entry.state,
        "reason": entry.reason if entry.state == "PENDING" else None,
        "submitted_at": entry.submitted_at or submitted_at,
        "started_at": entry.started_at,
        "ended_at": entry.ended_at if entry.state in TERMINAL_STATES else None,
        "node": entry.node,
    }
    if entry.state != "PENDING":
        values["expected_start_at"] = None
    if entry.state in TERMINAL_STATES:
        values.update(finished=True, exit_code=entry.exit_code, exit_signal=entry.exit_signal, elapsed_s=entry.elapsed_s)
    return values


def _run_values(job: TrackedJob, values: dict[str, Any]) -> dict[str, Any]:
    """The run count, and PREEMPTED for a spot job waiting between runs, from the new values.

    Each start Slurm reports that differs from the last one is a new run (a
    requeued job keeps its id and starts again). A spot job that has run and
    is pending again was preempted: squeue says PENDING, the API PREEMPTED.
    """
    changed: dict[str, Any] = {}
    started_at = values.get("started_at", job.started_at)
    run_count = job.run_count or 0  # an object not yet flushed has no column default yet
    if started_at is not None and started_at != job.started_at:
        run_count = changed["run_count"] = run_count + 1
    if job.preemptible and run_count > 0 and values.get("state", job.state) in ("PENDING", PREEMPTED):
        changed["state"] = PREEMPTED
    return changed


class JobStateRefresher:
    def __init__(
        self,
        session_factory: sessionmaker,
        slurm: SlurmClient,
        *,
        interval_s: float,
        submission_grace_s: float,
        unknown_after_s: float = Settings.unknown_after_s,
        count_outputs: OutputCounter | None = None,
    ) -> None:
        self._sessions = session_factory
        self._slurm = slurm
        # job.ended's output_files (gpupool.webhooks.outbox.output_counter); None: null.
        self._count_outputs = count_outputs
        self.interval = dt.timedelta(seconds=interval_s)
        self.submission_grace = dt.timedelta(seconds=submission_grace_s)
        self.unknown_after = dt.timedelta(seconds=unknown_after_s)
        # last_seen_at is rewritten only once it is this stale: not every job's row on every refresh.
        self._seen_resolution = self.unknown_after / 100
        # Before this moment the lease is known to be held: skip the database entirely.
        self._not_before = dt.datetime.min.replace(tzinfo=dt.UTC)

    def _claim_lease(self) -> dt.timedelta | None:
        """Take the lease (None) or return how much longer its current holder keeps it.

        A lease starts and ends by the database's clock, never a caller's: a host
        whose clock runs ahead would otherwise hold it past the interval.
        """
        interval_s = self.interval.total_seconds()
        with self._sessions() as session, session.begin():
            claimed = session.execute(
                update(SlurmSync)
                .where(
                    SlurmSync.id == LEASE_ID,
                    # A lease that starts in the future was written by a clock running ahead: it holds nothing.
                    or_(SlurmSync.started_at <= database_now(-interval_s), SlurmSync.started_at > database_now()),
                )
                .values(started_at=database_now())
            ).rowcount
            if claimed:
                return None
            lease = session.execute(select(SlurmSync.started_at, database_now()).where(SlurmSync.id == LEASE_ID)).first()
            if lease is not None:
                started_at, now = lease
                return max(started_at + self.interval - now, dt.timedelta(0))
        try:
            with self._sessions() as session, session.begin():
                session.execute(insert(SlurmSync).values(id=LEASE_ID, started_at=database_now()))
            return None
        except IntegrityError:
            return self.interval  # another process created the lease first and holds it

    def due(self) -> bool:
        """False while this process knows another holds the lease: no database call needed."""
        return utcnow() >= self._not_before

    def maybe_refresh(self) -> bool:
        """Refresh if this interval's lease is free; True if this call ran the refresh."""
        if not self.due():
            return False
        held_for = self._claim_lease()
        now = utcnow()
        if held_for is not None:
            self._not_before = now + held_for
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
                update(SlurmSync).where(SlurmSync.id == LEASE_ID).values(finished_at=database_now(), last_error=error)
            )
        return True

    def refresh(self, now: dt.datetime | None = None) -> None:
        """Read Slurm once for every unfinished job and store what it says.

        Slurm is asked between two short transactions, never inside one: no
        database transaction waits on squeue or sacct.
        """
        now = now or utcnow()
        # squeue runs while the database is read: on a 10,000-job queue each takes about as long.
        # A job submitted between the two is either not read (the next refresh takes it) or
        # not yet listed, which changes nothing until unknown_after has passed.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="squeue") as slurm_reader:
            asked = slurm_reader.submit(self._slurm.queue)
            with self._sessions() as session:
                tracked = session.execute(select(*_READ_COLUMNS).where(Job.finished.is_(False))).all()
            queue = asked.result()
        if not tracked:
            return
        # Anyone can write any comment: a tag counts only under the account and the user its job
        # was submitted as (the lookup's key: ``_submission_entry``), and a tenant copying its own
        # tag onto a later job does not move the API's job there.
        by_tag: dict[tuple[str, str, str], QueueEntry] = {}
        for entry in sorted(queue.values(), key=lambda entry: entry.slurm_job_id, reverse=True):
            if entry.comment.startswith(TAG_PREFIX):
                by_tag[(entry.account, entry.user, entry.comment)] = entry
        for tasks in queue.tasks.values():
            for entry in tasks.values():
                if entry.comment.startswith(TAG_PREFIX):
                    by_tag.setdefault((entry.account, entry.user, entry.comment), entry)
        arrays = [job for job in tracked if job.array_size is not None and job.slurm_job_id is not None]
        tasks_of: dict[str, list[Row[Any]]] = {}
        if arrays:
            with self._sessions() as session:
                rows = session.execute(
                    select(*_TASK_COLUMNS).where(JobTask.job_id.in_([job.id for job in arrays])).order_by(JobTask.task_index)
                ).all()
            for row in rows:
                tasks_of.setdefault(row.job_id, []).append(row)
        # squeue no longer lists it (past MinJobAge), lists it as ended, or lists a row that is not
        # this job's own: sacct has the final word. For an array, when any unfinished task is so.
        ended_or_forgotten = [
            job.slurm_job_id
            for job in tracked
            if job.slurm_job_id is not None
            and (
                self._array_needs_accounting(job, tasks_of.get(job.id, []), queue)
                if job.array_size is not None
                else (listed := self._queue_entry(job, queue)) is None or listed.state in TERMINAL_STATES
            )
        ]
        accounting_error: SlurmUnavailable | None = None
        records: Mapping[int, AccountingEntry]
        try:
            records = self._slurm.accounting(ended_or_forgotten)
        except SlurmUnavailable as exc:
            # slurmdbd down: squeue's answers still count, and the jobs only sacct knows go unanswered.
            records, accounting_error = {}, exc
        views = {
            job.id: self._task_views(job, tasks_of.get(job.id, []), queue, records)
            for job in arrays
        }
        answers = SlurmAnswers(queue, records, by_tag, views)
        # Most refreshes change few rows (a 10,000-job queue: none): only those are loaded and written.
        changing = [
            job.id
            for job in tracked
            if self.changes(job, answers, now) or any(view.changes for view in views.get(job.id, {}).values())
        ]
        if changing:
            self._write(changing, answers, now)
        if accounting_error is not None:
            raise accounting_error

    def _write(self, job_ids: list[str], answers: SlurmAnswers, now: dt.datetime) -> None:
        events = JobEvents(self._count_outputs)
        unfinished = select(Job).where(Job.finished.is_(False))
        if len(job_ids) <= _LOAD_BY_ID_MAX:
            unfinished = unfinished.where(Job.id.in_(job_ids))
        wanted = set(job_ids)
        with self._sessions() as session, session.begin():
            for job in session.scalars(unfinished):
                if job.id not in wanted:
                    continue  # submitted since the read: the next refresh takes it
                # Again, on the row as it is now: a submit may have recorded its Slurm id meanwhile.
                changes = self.changes(job, answers, now)
                if not changes:
                    continue
                events.note(job)
                self._log_verdict(job, changes)
                for column, value in changes.items():
                    setattr(job, column, value)
            self._write_tasks(session, wanted, answers)
            # Webhook events commit with the states they announce, or not at all.
            events.enqueue(session, now)

    def changes(self, job: TrackedJob, answers: SlurmAnswers, now: dt.datetime) -> dict[str, Any]:
        """The columns of ``job`` that Slurm's answers change, with their new values; empty when none."""
        if job.array_size is not None and job.slurm_job_id is not None:
            values = self._array_values(job, answers.tasks.get(job.id, {}), now)
        elif job.slurm_job_id is None:
            values = self._submission_values(job, self._submission_entry(job, answers), now)
        else:
            entry = self._queue_entry(job, answers.queue)
            values = _queue_values(entry, job.submitted_at) if entry is not None else {}
            record = answers.accounting.get(job.slurm_job_id)
            if record is not None and not self._slurm.owns(record, job.account, job.unix_user):
                record = None
            # A spot job's PREEMPTED run is requeued (PreemptMode=REQUEUE): the job goes on.
            requeued = job.preemptible and record is not None and record.state == PREEMPTED
            if record is not None and not requeued and (entry is None or entry.state in TERMINAL_STATES):
                values |= _accounting_values(record, values.get("submitted_at", job.submitted_at))
            values |= self._seen_values(job, entry is not None or record is not None, now)
            if self._estimate_passed(job.expected_start_at, values.get("expected_start_at"), now):
                del values["expected_start_at"]
        values |= _run_values(job, values)
        return {column: value for column, value in values.items() if getattr(job, column) != value}

    def _estimate_passed(self, stored: dt.datetime | None, listed: dt.datetime | None, now: dt.datetime) -> bool:
        """Both estimates are already due: only the clock moved them, so the row is not rewritten for it.

        Slurm may report an estimate that has passed as its own "now", which would
        otherwise rewrite every such pending job's row on every refresh.
        """
        due = now + self.interval
        return stored is not None and listed is not None and stored <= due and listed <= due

    # -- array jobs ----------------------------------------------------------------

    def _task_entry(self, job: TrackedJob, queue: JobRows[QueueEntry], index: int) -> QueueEntry | None:
        """squeue's row for task ``index`` of ``job``, believed as a single job's is (``_queue_entry``)."""
        assert job.slurm_job_id is not None
        entry = queue.tasks.get(job.slurm_job_id, {}).get(index)
        if entry is None or not self._slurm.owns(entry, job.account, job.unix_user) or entry.comment not in ("", job_tag(job.id)):
            return None
        return entry

    def _array_needs_accounting(self, job: TrackedJob, tasks: list[Row[Any]], queue: JobRows[QueueEntry]) -> bool:
        for task in tasks:
            if not task.finished:
                entry = self._task_entry(job, queue, task.task_index)
                if entry is None or entry.state in TERMINAL_STATES:
                    return True
        return False

    def _task_views(
        self, job: TrackedJob, tasks: list[Row[Any]], queue: JobRows[QueueEntry], records: Mapping[int, AccountingEntry]
    ) -> dict[int, TaskView]:
        """Each task of ``job`` as Slurm's answers leave it: squeue's row while it lists one, else sacct's."""
        assert job.slurm_job_id is not None
        accounted = records.tasks.get(job.slurm_job_id, {}) if isinstance(records, JobRows) else {}
        views: dict[int, TaskView] = {}
        for task in tasks:
            values: dict[str, Any] = {}
            answered = False
            if not task.finished:
                entry = self._task_entry(job, queue, task.task_index)
                if entry is not None:
                    answered = True
                    values = {
                        "state": entry.state,
                        "reason": entry.reason if entry.state == "PENDING" else None,
                        **_queue_start(entry),
                        "node": entry.node if entry.state != "PENDING" else None,
                    }
                record = accounted.get(task.task_index)
                if record is not None and not self._slurm.owns(record, job.account, job.unix_user):
                    record = None
                if record is not None and (entry is None or entry.state in TERMINAL_STATES):
                    answered = True
                    values |= {
                        key: value
                        for key, value in _accounting_values(record, None).items()
                        if key not in ("submitted_at", "expected_start_at")  # the job's own columns, not a task's
                    }
                    if record.state != "PENDING":
                        values["slurm_job_id"] = record.slurm_job_id
                elif entry is None and record is None and any(
                    self._slurm.owns(other, job.account, job.unix_user) for other in accounted.values()
                ):
                    # Neither squeue's snapshot nor sacct (which answered for this array) has the
                    # task, as its own row or in a pending record: Slurm removed it before it ran.
                    # A slurmdbd running behind still holds an older pending record with it in.
                    answered = True
                    values = {"state": "CANCELLED", "reason": REMOVED_WHILE_PENDING, "finished": True}
            changes = {column: value for column, value in values.items() if getattr(task, column) != value}
            merged = {column: changes.get(column, getattr(task, column)) for column in _TASK_VIEW_COLUMNS}
            views[task.task_index] = TaskView(**merged, changes=changes, answered=answered)
        return views

    def _array_values(self, job: TrackedJob, views: Mapping[int, TaskView], now: dt.datetime) -> dict[str, Any]:
        """The job's own columns, made from its tasks' (``array_state``)."""
        if not views:
            return {}
        ordered = [views[index] for index in sorted(views)]
        state = array_state([view.state for view in ordered])
        finished = all(view.finished for view in ordered)
        starts = [view.started_at for view in ordered if view.started_at is not None]
        values: dict[str, Any] = {
            "state": state,
            "task_states": task_states([view.state for view in ordered]),
            "reason": next((view.reason for view in ordered if view.state == "PENDING" and view.reason), None)
            if state == "PENDING" else None,
            "started_at": min(starts) if starts else None,
            "node": next((view.node for view in ordered if view.state == "RUNNING" and view.node), job.node),
        }
        if finished:
            ends = [view.ended_at for view in ordered if view.ended_at is not None]
            codes = [view.exit_code for view in ordered if view.exit_code is not None]
            signals = [view.exit_signal for view in ordered if view.exit_signal is not None]
            ended_at = max(ends) if ends else now
            values.update(
                finished=True,
                ended_at=ended_at,
                exit_code=max(codes) if codes else None,
                exit_signal=max(signals) if signals else None,
                elapsed_s=int((ended_at - min(starts)).total_seconds()) if starts else 0,
            )
        answered = any(view.answered for view in ordered) or finished
        if not finished:
            values |= self._seen_values(job, answered, now)
        return values

    def _write_tasks(self, session: Any, job_ids: set[str], answers: SlurmAnswers) -> None:
        changed = {
            job_id: {index: view.changes for index, view in views.items() if view.changes}
            for job_id, views in answers.tasks.items()
            if job_id in job_ids
        }
        changed = {job_id: tasks for job_id, tasks in changed.items() if tasks}
        if not changed:
            return
        for task in session.scalars(
            select(JobTask).where(JobTask.job_id.in_(list(changed)), JobTask.finished.is_(False))
        ):
            for column, value in changed[task.job_id].get(task.task_index, {}).items():
                setattr(task, column, value)

    def _queue_entry(self, job: TrackedJob, queue: Mapping[int, QueueEntry]) -> QueueEntry | None:
        """squeue's row for ``job``, believed only from its own account and user, with its tag or none."""
        entry = queue.get(job.slurm_job_id) if job.slurm_job_id is not None else None
        if entry is None or not self._slurm.owns(entry, job.account, job.unix_user) or entry.comment not in ("", job_tag(job.id)):
            return None
        return entry

    def _submission_entry(self, job: TrackedJob, answers: SlurmAnswers) -> QueueEntry | None:
        """The queued job carrying ``job``'s tag, submitted under its account by the user it was submitted as."""
        user = job.unix_user or self._slurm.settings.tenant_user_prefix + job.account
        return answers.by_tag.get((job.account, user, job_tag(job.id)))

    def _seen_values(self, job: TrackedJob, answered: bool, now: dt.datetime) -> dict[str, Any]:
        """Note that Slurm answered for ``job``, or give it up once it has not for ``unknown_after``."""
        if answered:
            if job.last_seen_at is None or now - job.last_seen_at >= self._seen_resolution:
                return {"last_seen_at": now}
            return {}
        if now - (job.last_seen_at or job.updated_at) < self.unknown_after:
            return {}
        return {"state": UNKNOWN, "reason": NOT_REPORTED, "finished": True, "expected_start_at": None}

    def _submission_values(self, job: TrackedJob, entry: QueueEntry | None, now: dt.datetime) -> dict[str, Any]:
        """A job whose sbatch never returned an id: adopted once its tag is queued, lost after the grace."""
        if entry is not None:
            return _queue_values(entry, job.submitted_at)
        attempted = job.submit_attempted_at or job.created_at
        if job.state == SUBMITTING and now - attempted > self.submission_grace:
            return {"state": "FAILED", "reason": SUBMISSION_LOST, "finished": True, "ended_at": now, "expected_start_at": None}
        return {}

    @staticmethod
    def _log_verdict(job: Job, changes: dict[str, Any]) -> None:
        if job.slurm_job_id is None and "slurm_job_id" in changes:
            log.info("adopting job %s: Slurm accepted it as %s after sbatch gave up", job.id, changes["slurm_job_id"])
        elif changes.get("state") == UNKNOWN:
            last_seen = job.last_seen_at or job.updated_at
            log.warning(
                "job %s (account %s, Slurm job %s): neither squeue nor sacct has reported it since %s; marked %s",
                job.id, job.account, job.slurm_job_id, utc_text(last_seen), UNKNOWN,
            )
