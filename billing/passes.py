"""The billing pass: sacct (or a saved dump) in, ledger rows out, exactly once.

This module runs passes (``run_pass``, ``backfill``, ``replay``); the rows are
made by ``billing.meter``, written by ``billing.ledger_writer``, and the
credits of runs a failed node or GPU ended come from ``billing.credits``
(``billing.gpu_failures`` tells the job's owner of the latter). Budget enforcement after a
pass is ``billing.enforcement``.

One pass is one database transaction. Its first statement updates the single
``billing_state`` row, which is the lock: a second pass waits there, then
sees the first one's rows and adds nothing. The rows, the automatic credits,
the pass record and the new high-water mark commit together or not at all,
so a failure (sacct down, a price missing, ``kill -9``) leaves the ledger as
it was and the next pass bills the same seconds again, once.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from billing.alerts import fire_alerts
from billing.archive import Archiver, read_text
from billing.credits import (
    automatic_credits,
    credit_runs,
    drain_failures,
    earliest_matching_drain,
    gpu_failure_candidates,
)
from billing.gpu_failures import announce
from billing.ledger_writer import JobIdLookup, write_ledger_rows
from billing.meter import Billed, RunKey, billed_by_run, meter_rows
from billing.node_health import record_drains
from billing.prices import load_prices
from billing.sacct import PASS_FIELDS, JobRun, RunReader, Tenancy, detect_delimiter, read_gpu_failures
from billing.storage import StorageMetered, StoredBytes, meter_storage, stored_bytes
from gpupool.config import Settings
from gpupool.db import utcnow
from gpupool.errors import BadRequest, GpupoolError, ServiceUnavailable, SlurmUnavailable
from gpupool.gpu_health.failure import GpuFailure
from gpupool.models import Account, BillingPass, BillingState, Job, LedgerEntry, MemberIdentity, NodeHealthEvent
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import ParseError, unpredictable_delimiter
from gpupool.slurm.report import NodeReason

log = logging.getLogger("gpupool.billing")

# A gpupool job row is written just before sbatch; allow for clock skew between hosts.
_SUBMIT_SLACK = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class PassReport:
    pass_id: int
    window_start: dt.datetime | None
    window_end: dt.datetime | None
    sacct_rows: int
    runs: int
    ledger_rows: int
    gpu_seconds: int
    amount_nanos: int
    credits: int
    archive_path: Path
    sha256: str
    # Rows a pass left unbilled, one sentence each (a replay refuses its file instead).
    refused: tuple[str, ...] = ()
    # Storage charged by the pass (billing.storage); a replay charges none.
    storage_charges: int = 0
    storage_amount_nanos: int = 0


ProgressHook = Callable[[PassReport | None], None]
# JobIDRaw -> the GPU failure recorded on the job, for the jobs asked about (SlurmClient.admin_comments).
GpuFailureLookup = Callable[[Sequence[int]], Mapping[int, GpuFailure]]
# sacct's --jobs list, asked in pieces this long.
_JOBS_PER_QUERY = 500


def sacct_gpu_failures(slurm: SlurmClient) -> GpuFailureLookup:
    """The pass's lookup: AdminComments of the runs a GPU failure may have ended, one sacct call per piece."""

    def lookup(job_ids: Sequence[int]) -> Mapping[int, GpuFailure]:
        failures: dict[int, GpuFailure] = {}
        for at in range(0, len(job_ids), _JOBS_PER_QUERY):
            delimiter = unpredictable_delimiter()
            text = slurm.admin_comments(job_ids[at:at + _JOBS_PER_QUERY], delimiter)
            try:
                failures.update(read_gpu_failures(text, delimiter))
            except ParseError as exc:
                raise SlurmUnavailable(f"unexpected sacct output: {exc}") from exc
        return failures

    return lookup


def _lock(session: Session, now: dt.datetime) -> dt.datetime | None:
    """Take the billing lock (held until commit) and return the high-water mark."""
    session.execute(update(BillingState).where(BillingState.id == 1).values(locked_at=now))
    mark = session.execute(select(BillingState.mark).where(BillingState.id == 1)).scalar_one_or_none()
    return mark


def _already_billed(session: Session, span: tuple[int, int] | None) -> dict[RunKey, Billed]:
    if span is None:
        return {}
    query = (
        select(
            LedgerEntry.cluster,
            LedgerEntry.job_id_raw,
            LedgerEntry.run_start,
            LedgerEntry.gpu_type,
            func.sum(LedgerEntry.seconds),
            func.max(case((LedgerEntry.final, 1), else_=0)),
        )
        .where(LedgerEntry.job_id_raw.between(*span))
        .group_by(LedgerEntry.cluster, LedgerEntry.job_id_raw, LedgerEntry.run_start, LedgerEntry.gpu_type)
    )
    return billed_by_run((c, j, s, t, int(n), bool(f)) for c, j, s, t, n, f in session.execute(query))


def _array_job_id(run: JobRun) -> int | None:
    """The array of an array task's run (``123`` of JobID ``123_4``); None for a single job's."""
    base, underscore, task = run.job_id.partition("_")
    return int(base) if underscore and base.isdigit() and task.isdigit() else None


def _gpupool_job_ids(session: Session, span: tuple[int, int] | None, arrays: AbstractSet[int] = frozenset()) -> JobIdLookup:
    """API job id of a run: the latest job row with its Slurm id and account created before it started.

    An array task's run belongs to the job of its array's id, which gpupool records.
    """
    candidates: dict[int, list[tuple[dt.datetime, str, str]]] = {}
    if span is not None:
        columns = (Job.slurm_job_id, Job.created_at, Job.id, Job.account)
        queries = [select(*columns).where(Job.slurm_job_id.between(*span))]
        outside = sorted(array for array in arrays if not span[0] <= array <= span[1])
        if outside:
            queries.append(select(*columns).where(Job.slurm_job_id.in_(outside)))
        for query in queries:
            for slurm_job_id, created_at, job_id, account in session.execute(query):
                if slurm_job_id is not None:
                    candidates.setdefault(slurm_job_id, []).append((created_at, job_id, account))

    def lookup(run: JobRun) -> str | None:
        options = candidates.get(_array_job_id(run) or run.job_id_raw)
        if not options:
            return None
        eligible = [o for o in options if o[0] <= run.start + _SUBMIT_SLACK and o[2] == run.account]
        return max(eligible)[1] if eligible else None

    return lookup


def tenancy(session: Session, settings: Settings) -> Tenancy:
    """The tenant user of each account this database knows, and its members' own users, for judging whose rows are whose."""
    users = session.execute(select(Account.name, Account.unix_user).where(Account.unix_user.is_not(None))).all()
    members = session.execute(select(MemberIdentity.unix_user, MemberIdentity.account)).all()
    return Tenancy(
        settings.tenant_user_prefix, {name: user for name, user in users if user}, {user: account for user, account in members}
    )


def bill_sacct_output(
    session: Session,
    settings: Settings,
    text: str,
    *,
    delimiter: str,
    kind: str,
    source: str,
    window: tuple[dt.datetime | None, dt.datetime | None],
    started_at: dt.datetime,
    default_cluster: str | None = None,
    fields: tuple[str, ...] | None = None,
    measure_storage: StoredBytes | None = None,
    gpu_failures: GpuFailureLookup | None = None,
    node_states: Sequence[NodeReason] | None = None,
) -> PassReport:
    """Bill ``text`` inside the caller's transaction, which must hold the billing lock.

    With ``gpu_failures`` (a pass, which can ask sacct) runs a failed GPU ended are
    credited (``billing_credit_gpu_failures``); a replay's output has no AdminComment.
    With ``node_states`` (a pass: sinfo's nodes) the GPU check's drains are recorded
    first (billing.node_health), so a run that failed shortly before its node drained
    for a failed GPU is credited by this pass (billing.credits.failed_before_the_check).

    With ``measure_storage`` (a pass, not a replay of old output) the accounts' storage is
    measured and charged too (billing.storage), in the same transaction.

    ``fields`` names the columns of header-less output; without it the first line is the header.
    """
    archiver = Archiver(text, Path(settings.billing_archive_dir), f"{started_at:%Y%m%dT%H%M%S}-{kind}")

    def unreadable(exc: ParseError) -> GpupoolError:
        if kind == "replay":
            return BadRequest(f"{source}: {exc}")
        return SlurmUnavailable(f"unexpected sacct output: {exc}")

    try:
        # A replay refuses a file with one row it cannot believe; a pass reads sacct itself,
        # under its own delimiter, and leaves such a row out without holding up every other account.
        reader = RunReader(
            text, delimiter, default_cluster, fields, tenancy(session, settings), refuse_mismatches=kind == "replay"
        )
    except ParseError as exc:
        archiver.join()
        raise unreadable(exc) from exc
    span = reader.job_id_span()
    prices = load_prices(session)
    billed = _already_billed(session, span)
    job_id_of = _gpupool_job_ids(session, span, reader.array_job_ids())
    record = BillingPass(
        kind=kind,
        started_at=started_at,
        finished_at=started_at,
        window_start=window[0],
        window_end=window[1],
        source=source,
        source_sha256="",  # filled in below, once the archive thread is done
        archive_path=None,
        sacct_rows=0,
        ledger_rows=0,
        adjustment_rows=0,
    )
    session.add(record)
    session.flush()
    if node_states is not None:
        record_drains(session, settings, node_states, started_at, record.id)
    runs: list[JobRun] = []

    def read_runs() -> Iterator[JobRun]:
        for run in reader.runs():
            runs.append(run)
            yield run

    try:
        # Read, meter and write in one stream: PostgreSQL stores rows while later ones are read.
        rows = write_ledger_rows(session, record.id, meter_rows(read_runs(), billed, prices), job_id_of)
    except ParseError as exc:
        raise unreadable(exc) from exc
    for reason in reader.refused:
        log.warning("billing pass %s: not billed, %s", record.id, reason)
    failures: Mapping[int, GpuFailure] = {}
    drains: list[GpuFailure] = []
    check_interval = dt.timedelta(seconds=settings.gpu_check_interval_s)
    if gpu_failures is not None and settings.billing_credit_gpu_failures:
        candidates = sorted({run.job_id_raw for run in gpu_failure_candidates(runs)})
        failures = gpu_failures(candidates) if candidates else {}
        drains = _recent_gpu_drains(session, runs)
    written = credit_runs(session, automatic_credits(
        runs, failures, failed_nodes=settings.billing_credit_failed_nodes, gpu_failures=settings.billing_credit_gpu_failures,
        drains=drains, check_interval=check_interval,
    ), started_at)
    announce(session, written, job_id_of, started_at)
    credits = len(written)
    storage = meter_storage(session, settings, record.id, started_at, measure_storage) if measure_storage else StorageMetered()
    try:
        archive_path, sha256 = archiver.result()
    except OSError as exc:
        raise ServiceUnavailable(f"cannot archive the sacct output in {settings.billing_archive_dir}: {exc}") from exc
    record.source_sha256 = sha256
    record.archive_path = str(archive_path)
    record.sacct_rows = reader.rows
    record.ledger_rows = len(rows)
    record.adjustment_rows = credits
    # In the pass's transaction: a threshold fires exactly when the rows that crossed it are stored.
    fire_alerts(session, settings, {*(run.account for run in runs), *storage.charged_accounts}, started_at, record.id)
    record.finished_at = utcnow()
    return PassReport(
        pass_id=record.id,
        window_start=window[0],
        window_end=window[1],
        sacct_rows=reader.rows,
        runs=len(runs),
        ledger_rows=len(rows),
        gpu_seconds=sum(row.gpu_seconds for row in rows),
        amount_nanos=sum(row.amount_nanos for row in rows),
        credits=credits,
        storage_charges=storage.charges,
        storage_amount_nanos=storage.amount_nanos,
        archive_path=archive_path,
        sha256=sha256,
        refused=tuple(reader.refused),
    )


def _recent_gpu_drains(session: Session, runs: Sequence[JobRun]) -> list[GpuFailure]:
    """The recorded drains for a failed GPU that a failed run among ``runs`` may have died of."""
    since = earliest_matching_drain(runs)
    if since is None:
        return []
    rows = session.execute(
        select(NodeHealthEvent.node, NodeHealthEvent.reason, NodeHealthEvent.drained_at)
        .where(NodeHealthEvent.drained_at >= since)
        .order_by(NodeHealthEvent.drained_at)
    ).all()
    return drain_failures((node, reason, drained_at) for node, reason, drained_at in rows)


def _windows(start: dt.datetime, end: dt.datetime, chunk: dt.timedelta) -> list[tuple[dt.datetime, dt.datetime]]:
    windows = []
    while start < end:
        windows.append((start, min(end, start + chunk)))
        start += chunk
    return windows


def run_pass(
    session_factory: sessionmaker,
    slurm: SlurmClient,
    settings: Settings,
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    now: dt.datetime | None = None,
    measure_storage: StoredBytes = stored_bytes,
) -> PassReport:
    """One pass over sacct's window, and the accounts' storage; committed whole, or not at all."""
    started_at = now or utcnow().replace(microsecond=0)
    with session_factory() as session, session.begin():
        mark = _lock(session, started_at)
        window_end = min(until, started_at) if until else started_at
        if since is not None:
            window_start = since
        elif mark is not None:
            window_start = mark - dt.timedelta(seconds=settings.billing_overlap_s)
        else:
            window_start = window_end - dt.timedelta(seconds=settings.billing_initial_lookback_s)
        # A delimiter no job name can predict: names cannot forge columns or rows (billing.sacct).
        delimiter = unpredictable_delimiter()
        text = slurm.billing_accounting(window_start, window_end, PASS_FIELDS, delimiter)
        node_states = _node_states(slurm)
        report = bill_sacct_output(
            session,
            settings,
            text,
            delimiter=delimiter,
            kind="run",
            source="sacct",
            window=(window_start, window_end),
            started_at=started_at,
            measure_storage=measure_storage,
            gpu_failures=sacct_gpu_failures(slurm),
            node_states=node_states,
        )
        session.execute(
            update(BillingState)
            .where(BillingState.id == 1)
            .where((BillingState.mark.is_(None)) | (BillingState.mark < window_end))
            .values(mark=window_end)
        )
    return report


def _node_states(slurm: SlurmClient) -> list[NodeReason] | None:
    """sinfo's nodes, for the GPU check's drains (billing.node_health); sinfo failing costs the pass nothing but those, until the next."""
    try:
        return slurm.node_reasons()
    except GpupoolError as exc:
        log.warning("billing pass: node states not read (%s); GPU drains are noted by the next pass", exc)
        return None


def backfill(
    session_factory: sessionmaker,
    slurm: SlurmClient,
    settings: Settings,
    since: dt.datetime,
    until: dt.datetime,
    *,
    on_window: ProgressHook | None = None,
) -> list[PassReport]:
    """Passes over [since, until) in chunks, each committed on its own."""
    reports = []
    for start, end in _windows(since, until, dt.timedelta(seconds=settings.billing_backfill_chunk_s)):
        report = run_pass(session_factory, slurm, settings, since=start, until=end)
        reports.append(report)
        if on_window is not None:
            on_window(report)
    return reports


def backfill_windows(settings: Settings, since: dt.datetime, until: dt.datetime) -> int:
    return len(_windows(since, until, dt.timedelta(seconds=settings.billing_backfill_chunk_s)))


def replay(
    session_factory: sessionmaker,
    settings: Settings,
    path: Path,
    *,
    delimiter: str | None = None,
    cluster: str | None = None,
    fields: tuple[str, ...] | None = None,
) -> PassReport:
    """Bill a saved sacct dump (ours, gzip or plain, or any ``--parsable2``); idempotent.

    Without ``fields`` the dump's first line is its header and names the delimiter;
    with them (``XDMOD_FIELDS`` for an Open XDMoD export) it has no header, and the
    delimiter is ``|`` unless given. A line that is not a whole row, or a row
    ``billing.sacct`` cannot believe, refuses the whole file (BadRequest naming
    the line): nothing of it is billed.
    """
    try:
        text = read_text(path)
    except OSError as exc:
        raise BadRequest(f"cannot read {path}: {exc.strerror or exc}") from exc
    stripped = text.lstrip()
    first_line = stripped[: stripped.find("\n")] if "\n" in stripped else stripped
    if not first_line:
        raise BadRequest(f"{path} is empty; expected sacct --parsable2 output")
    if delimiter is None and fields is not None:
        delimiter = "|"
    if delimiter is None:
        try:
            delimiter = detect_delimiter(first_line)
        except ParseError as exc:
            raise BadRequest(f"{path}: {exc}") from exc
    started_at = utcnow().replace(microsecond=0)
    with session_factory() as session, session.begin():
        _lock(session, started_at)
        return bill_sacct_output(
            session,
            settings,
            text,
            delimiter=delimiter,
            kind="replay",
            source=str(path.resolve()),
            window=(None, None),
            started_at=started_at,
            default_cluster=cluster,
            fields=fields,
        )
