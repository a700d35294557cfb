"""The billing pass: sacct (or a saved dump) in, ledger rows out, exactly once.

One pass is one database transaction. Its first statement updates the single
``billing_state`` row, which is the lock: a second pass waits there, then
sees the first one's rows and adds nothing. The rows, the automatic credits,
the pass record and the new high-water mark commit together or not at all,
so a failure (sacct down, a price missing, ``kill -9``) leaves the ledger as
it was and the next pass bills the same seconds again, once.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import and_, case, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from billing.archive import Archiver, read_text
from billing.budgets import remaining_nanos
from billing.meter import Billed, LedgerRow, RunKey, billed_by_run, failed_node_credits, meter_rows
from billing.prices import load_prices
from billing.sacct import FAILED_NODE_STATES, SACCT_FIELDS, JobRun, RunReader, detect_delimiter
from gpupool.config import Settings
from gpupool.db import utcnow
from gpupool.errors import BadRequest, GpupoolError, ServiceUnavailable, SlurmUnavailable
from gpupool.models import Account, Adjustment, BillingPass, BillingState, Job, LedgerEntry
from gpupool.slurm import SlurmClient
from gpupool.slurm_parse import ParseError

log = logging.getLogger("gpupool.billing")
LEDGER_COLUMNS = (
    "pass_id",
    "account",
    "cluster",
    "slurm_job_id",
    "job_id_raw",
    "run_start",
    "gpupool_job_id",
    "job_name",
    "state",
    "gpu_type",
    "gpus",
    "period",
    "interval_from",
    "interval_to",
    "seconds",
    "gpu_seconds",
    "unit_price_nanos",
    "amount_nanos",
    "correction",
    "final",
)
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


ProgressHook = Callable[[PassReport | None], None]


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


JobIdLookup = Callable[[JobRun], str | None]


def _gpupool_job_ids(session: Session, span: tuple[int, int] | None) -> JobIdLookup:
    """API job id of a run: the latest job row with its Slurm id and account created before it started."""
    candidates: dict[int, list[tuple[dt.datetime, str, str]]] = {}
    if span is not None:
        query = select(Job.slurm_job_id, Job.created_at, Job.id, Job.account).where(Job.slurm_job_id.between(*span))
        for slurm_job_id, created_at, job_id, account in session.execute(query):
            if slurm_job_id is not None:
                candidates.setdefault(slurm_job_id, []).append((created_at, job_id, account))

    def lookup(run: JobRun) -> str | None:
        options = candidates.get(run.job_id_raw)
        if not options:
            return None
        eligible = [o for o in options if o[0] <= run.start + _SUBMIT_SLACK and o[2] == run.account]
        return max(eligible)[1] if eligible else None

    return lookup


_COPY_BATCH = 1000  # rows per chunk: ~200 KB, far below _COPY_READ_SIZE
_COPY_READ_SIZE = 64 * 1024 * 1024
COPY_LEDGER_SQL = (
    f"COPY ledger_entries ({', '.join(LEDGER_COLUMNS)}) FROM STDIN WITH (FORMAT csv, FORCE_NULL (gpupool_job_id))"
)


def _ledger_values(
    pass_id: int, row: LedgerRow, job_id_of: JobIdLookup, run_start: object, interval_from: object, interval_to: object
) -> tuple:
    """One ledger row in ``LEDGER_COLUMNS`` order; the caller gives the times as it writes them."""
    run = row.run
    return (
        pass_id,
        run.account,
        run.cluster,
        run.job_id,
        run.job_id_raw,
        run_start,
        job_id_of(run),
        run.name,
        run.state,
        row.gpu_type,
        row.gpus,
        row.period,
        interval_from,
        interval_to,
        row.seconds,
        row.gpu_seconds,
        row.unit_price_nanos,
        row.amount_nanos,
        row.correction,
        row.final,
    )


def ledger_csv_lines(
    pass_id: int, rows: Iterable[LedgerRow], job_id_of: JobIdLookup, written: list[LedgerRow] | None = None
) -> Iterator[str]:
    """The rows as COPY's CSV input, in ``LEDGER_COLUMNS`` order, ``_COPY_BATCH`` rows per chunk.

    Each row is also appended to ``written``, if given.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
    batch: list[tuple] = []
    keep = written.append if written is not None else None
    for row in rows:
        if keep is not None:
            keep(row)
        run = row.run
        # sacct's own text where it fits: isoformat costs more than the rest of the row.
        start_text = run.start_text + "+00:00" if run.start_text else run.start.isoformat()
        batch.append(
            _ledger_values(
                pass_id,
                row,
                job_id_of,
                start_text,
                start_text if row.interval_from == run.start else row.interval_from.isoformat(),
                run.end_text + "+00:00" if run.end_text and row.interval_to == run.end else row.interval_to.isoformat(),
            )
        )
        if len(batch) == _COPY_BATCH:
            writer.writerows(batch)
            batch.clear()
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    writer.writerows(batch)
    yield buffer.getvalue()


class _ChunkReader:
    """A file-like view of text chunks for COPY: PostgreSQL ingests while Python still produces.

    An exception while producing ends the data early and is re-raised by ``reraise``,
    so the caller's transaction rolls back with the real cause.
    """

    def __init__(self, chunks: Iterator[str]) -> None:
        self._chunks = chunks
        self.error: BaseException | None = None

    def read(self, size: int = -1) -> str:
        # Whole chunks (COPY is called with a read size above any chunk): slicing a
        # pending buffer 8 KiB at a time would copy it over and over.
        if self.error is None:
            try:
                return next(self._chunks)
            except StopIteration:
                return ""
            except Exception as exc:  # noqa: BLE001 - handed back by reraise()
                self.error = exc
        return ""

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error


def _insert_rows(session: Session, pass_id: int, rows: Iterable[LedgerRow], job_id_of: JobIdLookup) -> list[LedgerRow]:
    """Write ``rows`` (consumed lazily on PostgreSQL) and return them."""
    written: list[LedgerRow] = []
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        # COPY is several times faster than executemany, and reading the rows from a
        # generator lets the server parse them on the other core while these are made.
        reader = _ChunkReader(ledger_csv_lines(pass_id, rows, job_id_of, written))
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.copy_expert(COPY_LEDGER_SQL, reader, size=_COPY_READ_SIZE)
        finally:
            cursor.close()
        reader.reraise()
        return written
    written = list(rows)
    if not written:
        return written
    session.execute(
        insert(LedgerEntry),
        [
            dict(zip(LEDGER_COLUMNS, _ledger_values(pass_id, row, job_id_of, row.run.start, row.interval_from, row.interval_to), strict=True))
            for row in written
        ],
    )
    return written


def _credit_failed_nodes(session: Session, runs: Sequence[JobRun], now: dt.datetime) -> int:
    """Credit back every charge of runs that ended in NODE_FAIL or BOOT_FAIL; once per run and period."""
    failed = [run for run in runs if run.state in FAILED_NODE_STATES]
    if not failed:
        return 0
    amounts: dict[tuple[RunKey, str], int] = {}
    for run in failed:
        query = (
            select(LedgerEntry.gpu_type, LedgerEntry.period, func.sum(LedgerEntry.amount_nanos))
            .where(
                and_(
                    LedgerEntry.cluster == run.cluster,
                    LedgerEntry.job_id_raw == run.job_id_raw,
                    LedgerEntry.run_start == run.start,
                )
            )
            .group_by(LedgerEntry.gpu_type, LedgerEntry.period)
        )
        for gpu_type, period, nanos in session.execute(query):
            amounts[((run.cluster, run.job_id_raw, run.start, gpu_type), period)] = int(nanos)
    written = 0
    for run, period, credit in failed_node_credits(failed, amounts):
        key = f"failed-node:{run.cluster}:{run.job_id_raw}:{run.start:%Y%m%dT%H%M%S}:{period}"
        if session.execute(select(Adjustment.id).where(Adjustment.source_key == key)).first():
            continue
        session.add(
            Adjustment(
                account=run.account,
                period=period,
                amount_nanos=credit,
                reason=f"automatic credit: job {run.job_id} ended in {run.state}",
                kind="failed_node_credit",
                source_key=key,
                created_by="gpupool billing",
                created_at=now,
            )
        )
        written += 1
    session.flush()
    return written


def bill_text(
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
) -> PassReport:
    """Bill ``text`` inside the caller's transaction, which must hold the billing lock."""
    archiver = Archiver(text, Path(settings.billing_archive_dir), f"{started_at:%Y%m%dT%H%M%S}-{kind}")

    def unreadable(exc: ParseError) -> GpupoolError:
        if kind == "replay":
            return BadRequest(f"{source}: {exc}")
        return SlurmUnavailable(f"unexpected sacct output: {exc}")

    try:
        reader = RunReader(text, delimiter, default_cluster)
    except ParseError as exc:
        archiver.join()
        raise unreadable(exc) from exc
    span = reader.job_id_span()
    prices = load_prices(session)
    billed = _already_billed(session, span)
    job_id_of = _gpupool_job_ids(session, span)
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
    runs: list[JobRun] = []

    def read_runs() -> Iterator[JobRun]:
        for run in reader.runs():
            runs.append(run)
            yield run

    try:
        # Read, meter and write in one stream: PostgreSQL stores rows while later ones are read.
        rows = _insert_rows(session, record.id, meter_rows(read_runs(), billed, prices), job_id_of)
    except ParseError as exc:
        raise unreadable(exc) from exc
    credits = _credit_failed_nodes(session, runs, started_at) if settings.billing_credit_failed_nodes else 0
    try:
        archive_path, sha256 = archiver.result()
    except OSError as exc:
        raise ServiceUnavailable(f"cannot archive the sacct output in {settings.billing_archive_dir}: {exc}") from exc
    record.source_sha256 = sha256
    record.archive_path = str(archive_path)
    record.sacct_rows = reader.rows
    record.ledger_rows = len(rows)
    record.adjustment_rows = credits
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
        archive_path=archive_path,
        sha256=sha256,
    )


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
) -> PassReport:
    """One pass over sacct's window; committed whole, or not at all."""
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
        # A delimiter no job name can predict: names cannot forge columns or rows.
        delimiter = f"|{secrets.token_hex(6)}|"
        text = slurm.billing_accounting(window_start, window_end, SACCT_FIELDS, delimiter)
        report = bill_text(
            session,
            settings,
            text,
            delimiter=delimiter,
            kind="run",
            source="sacct",
            window=(window_start, window_end),
            started_at=started_at,
        )
        session.execute(
            update(BillingState)
            .where(BillingState.id == 1)
            .where((BillingState.mark.is_(None)) | (BillingState.mark < window_end))
            .values(mark=window_end)
        )
    return report


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
) -> PassReport:
    """Bill a saved sacct dump (ours, gzip or plain, or any ``--parsable2`` with a header); idempotent."""
    try:
        text = read_text(path)
    except OSError as exc:
        raise BadRequest(f"cannot read {path}: {exc.strerror or exc}") from exc
    stripped = text.lstrip()
    first_line = stripped[: stripped.find("\n")] if "\n" in stripped else stripped
    if not first_line:
        raise BadRequest(f"{path} is empty; expected sacct --parsable2 output with a header line")
    if delimiter is None:
        try:
            delimiter = detect_delimiter(first_line)
        except ParseError as exc:
            raise BadRequest(f"{path}: {exc}") from exc
    started_at = utcnow().replace(microsecond=0)
    with session_factory() as session, session.begin():
        _lock(session, started_at)
        return bill_text(
            session,
            settings,
            text,
            delimiter=delimiter,
            kind="replay",
            source=str(path.resolve()),
            window=(None, None),
            started_at=started_at,
            default_cluster=cluster,
        )


def exhausted_accounts(session: Session, now: dt.datetime) -> list[str]:
    names = session.scalars(
        select(Account.name).where(
            (Account.prepaid_credit_nanos.is_not(None)) | (Account.monthly_limit_nanos.is_not(None))
        )
    ).all()
    exhausted = []
    for name in names:
        remaining = remaining_nanos(session, name, now)
        if remaining is not None and remaining <= 0:
            exhausted.append(name)
    return exhausted


def cancel_exhausted(session_factory: sessionmaker, slurm: SlurmClient, now: dt.datetime | None = None) -> list[str]:
    """Cancel the jobs of every account whose budget is spent (operator setting billing_cancel_exhausted)."""
    with session_factory() as session:
        names = exhausted_accounts(session, now or utcnow())
    cancelled = []
    for name in names:
        try:
            slurm.cancel_account_jobs(name)
            cancelled.append(name)
        except GpupoolError as exc:
            log.warning("could not cancel the jobs of exhausted account %s: %s", name, exc.message)
    return cancelled
