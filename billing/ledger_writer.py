"""Writing ledger rows: PostgreSQL's ``COPY`` fed while the rows are still being made.

On PostgreSQL the rows go in as CSV through ``COPY ... FROM STDIN``, read from
a generator, so the server parses one batch while Python meters the next. On
SQLite (tests, small installs) they go in with one ``executemany`` insert. Both
write the same values: ``ledger_values`` is the one mapping of a ``LedgerRow``
to the ``ledger_entries`` columns.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Iterator

from sqlalchemy import insert
from sqlalchemy.orm import Session

from billing.meter import LedgerRow
from billing.sacct import JobRun
from gpupool.models import LedgerEntry

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
    "tier",
    "member_user",
)
_COPY_BATCH = 1000  # rows per chunk: ~200 KB, far below _COPY_READ_SIZE
_COPY_READ_SIZE = 64 * 1024 * 1024
COPY_LEDGER_SQL = (
    f"COPY ledger_entries ({', '.join(LEDGER_COLUMNS)}) FROM STDIN WITH (FORMAT csv, FORCE_NULL (gpupool_job_id, member_user))"
)

# The API job id of a run, or None for a job submitted around gpupool.
JobIdLookup = Callable[[JobRun], str | None]


def ledger_values(
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
        row.tier,
        run.member_user,
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
            ledger_values(
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


def write_ledger_rows(session: Session, pass_id: int, rows: Iterable[LedgerRow], job_id_of: JobIdLookup) -> list[LedgerRow]:
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
            dict(zip(LEDGER_COLUMNS, ledger_values(pass_id, row, job_id_of, row.run.start, row.interval_from, row.interval_to), strict=True))
            for row in written
        ],
    )
    return written
