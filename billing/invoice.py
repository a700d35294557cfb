"""Invoices: one CSV line per job run per period, storage lines, adjustment lines, then the total.

A job line carries its price ``tier`` (``normal``, or ``spot`` for a
preemptible run at the spot price), and ``end_reason`` when gpupool itself
ended the job (idle GPUs past the policy's grace, an idle session): on the
line of the run it ended, the one whose end is the job's ``ended_at``, so an
earlier run of a requeued job or the earlier month of a run across a month's
end shows none. Both come after ``currency``, so readers that go by the
header, or by position up to ``currency``, read the rest as before.

Lines come from one GROUP BY streamed off a server-side cursor, so memory
stays flat however many lines an invoice has. A line groups a run's ledger
rows of one GPU type, one unit price and one tier (a price change mid-run
gives the run a second line, and so does a spot run billed at the full price
until the spot tier's first price, even when that price is the same). Its
amount is rounded once (``billing.money``), and the total is the sum of the
rounded lines. Order is fixed: job lines by cluster, Slurm job id, run start,
GPU type, price and tier; adjustments by time.

Storage (billing.storage) is one line per price in the period, after the job
lines: ``line_type`` ``storage``, ``start`` and ``end`` the first and last
charged moments, ``billed_seconds`` the seconds charged, ``unit_price`` the
price per GiB-month, and ``gib_hours`` (the last column, empty on other lines)
the GiB-hours kept, to three decimals.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import queue
import threading
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from sqlalchemy import BigInteger, cast, func, select
from sqlalchemy.engine import Connection

from billing.calendar import next_month_start
from billing.money import format_cents, format_nanos, invoiced_cents, round_to_cents
from gpupool.clock import utc_text
from gpupool.models import Adjustment, Job, LedgerEntry, StorageCharge

INVOICE_COLUMNS = (
    "line_type",
    "gpupool_job_id",
    "slurm_job_id",
    "job_name",
    "gpu_type",
    "gpus",
    "start",
    "end",
    "billed_seconds",
    "gpu_seconds",
    "unit_price",
    "amount",
    "currency",
    "tier",
    "end_reason",
    "gib_hours",
)
# A spreadsheet runs a cell that starts with one of these as a formula (OWASP, CSV injection).
FORMULA_STARTS = frozenset("=+-@\t\r")
_BATCH = 10_000
GIB_HOUR_BYTE_SECONDS = 1024**3 * 3600


def spreadsheet_text(cell: str) -> str:
    """``cell`` as text a spreadsheet shows and never runs: a formula start gets a leading ``'``.

    Only for text cells. Numbers gpupool writes itself (a credit's ``-12.50``)
    stay numbers, which a spreadsheet reads as values, never as formulas.
    """
    return "'" + cell if cell[:1] in FORMULA_STARTS else cell


@dataclass
class InvoiceTotals:
    lines: int = 0
    billed_seconds: int = 0
    gpu_seconds: int = 0
    cents: int = 0


def _utc_texts(dialect: str, start: Any, seconds: Any) -> tuple[Any, Any]:
    """SQL for a line's start and end as ``2026-11-03T23:00:00Z``: the database formats a
    million timestamps far faster than Python can."""
    if dialect == "postgresql":
        shape = 'YYYY-MM-DD"T"HH24:MI:SS"Z"'
        end = start + func.make_interval(0, 0, 0, 0, 0, 0, seconds)
        return (
            func.to_char(func.timezone("UTC", start), shape),
            func.to_char(func.timezone("UTC", end), shape),
        )
    shape = "%Y-%m-%dT%H:%M:%SZ"
    return func.strftime(shape, start), func.strftime(shape, start, func.printf("%+d seconds", seconds))


def _read_ahead(fetch: Callable[[], Sequence[Any]]) -> Generator[Sequence[Any], None, None]:
    """What ``fetch`` returns until it returns nothing, each batch fetched by a thread while the caller writes the one before.

    A server-side cursor computes its next batch only when asked, and psycopg2
    waits for it without holding the GIL: asking one batch ahead lets PostgreSQL
    group and format lines on one core while this process writes CSV on the other
    (``gpupool invoice`` of 1,000,000 lines: 14.2-14.7 s one after the other, 9.2-9.3 s
    so; docs/benchmarks.md).
    The thread alone touches the cursor until this generator is closed.
    """
    batches: queue.Queue[Sequence[Any] | BaseException | None] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce() -> None:
        try:
            while not stop.is_set():
                batch = fetch()
                batches.put(batch or None)
                if not batch:
                    return
        except BaseException as exc:  # handed to the caller, raised there
            batches.put(exc)

    thread = threading.Thread(target=produce, name="invoice-read-ahead", daemon=True)
    thread.start()
    try:
        while (item := batches.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # a caller that stops early: let a waiting put finish
            with contextlib.suppress(queue.Empty):
                batches.get(timeout=0.05)


def job_line_groups(connection: Connection, account: str, period: str) -> Iterator[Sequence[Any]]:
    """Per job run, type, price and tier: ids, name, GPUs, start, end, net seconds, GPU-seconds, price, tier, nanos.

    A run's usage within one period is one contiguous span, so it ends at
    start + net seconds (correction rows included).
    """
    entry = LedgerEntry
    seconds = cast(func.sum(entry.seconds), BigInteger)
    start_text, end_text = _utc_texts(connection.dialect.name, func.min(entry.interval_from), seconds)
    query = (
        select(
            func.max(entry.gpupool_job_id),
            func.max(entry.slurm_job_id),
            func.max(entry.job_name),
            entry.gpu_type,
            func.max(entry.gpus),
            start_text,
            end_text,
            seconds,
            cast(func.sum(entry.gpu_seconds), BigInteger),
            entry.unit_price_nanos,
            entry.tier,
            cast(func.sum(entry.amount_nanos), BigInteger),
        )
        .where(entry.account == account, entry.period == period)
        .group_by(entry.cluster, entry.job_id_raw, entry.run_start, entry.gpu_type, entry.unit_price_nanos, entry.tier)
        # The grouping order itself, which ix_ledger_invoice_tier holds: PostgreSQL streams
        # groups straight off the index, with no sort, while this process writes them.
        .order_by(entry.cluster, entry.job_id_raw, entry.run_start, entry.gpu_type, entry.unit_price_nanos, entry.tier)
    )
    if connection.dialect.name == "postgresql":
        # A named (server-side) cursor straight from psycopg2: the Result layer would
        # cost more per line than everything else the export does.
        compiled = query.compile(dialect=connection.dialect)
        cursor = connection.connection.dbapi_connection.cursor(name=f"invoice_{uuid.uuid4().hex}")  # type: ignore[union-attr]
        try:
            cursor.itersize = _BATCH  # type: ignore[union-attr]
            cursor.execute(str(compiled), compiled.params)
            with contextlib.closing(_read_ahead(lambda: cursor.fetchmany(_BATCH))) as batches:
                yield from batches
        finally:
            cursor.close()
        return
    # Per statement: Connection.execution_options would change the connection itself.
    result = connection.execute(query, execution_options={"stream_results": True, "yield_per": _BATCH})
    yield from result.partitions(_BATCH)


@dataclass
class StorageLine:
    start: dt.datetime
    end: dt.datetime
    seconds: int
    byte_seconds: int
    nanos_per_gib_month: int
    amount_nanos: int


def storage_lines(connection: Connection, account: str, period: str) -> list[StorageLine]:
    """The account's storage charges in ``period``, one line per price, in the order each price was first charged.

    A period holds at most a row per hour (billing.storage): few enough to group here.
    """
    charge = StorageCharge
    rows = connection.execute(
        select(charge.interval_from, charge.interval_to, charge.byte_seconds, charge.nanos_per_gib_month, charge.amount_nanos)
        .where(charge.account == account, charge.period == period)
        .order_by(charge.interval_from)
    )
    lines: dict[int, StorageLine] = {}
    for start, end, byte_seconds, price, nanos in rows:
        line = lines.get(price)
        if line is None:
            line = lines[price] = StorageLine(start, end, 0, 0, price, 0)
        line.end = end
        line.seconds += int((end - start).total_seconds())
        line.byte_seconds += byte_seconds
        line.amount_nanos += nanos
    return list(lines.values())


def gib_hours_text(byte_seconds: int) -> str:
    """GiB-hours to three decimals, rounded half up: for reading; the amount comes from the exact byte-seconds."""
    thousandths = (byte_seconds * 1000 * 2 + GIB_HOUR_BYTE_SECONDS) // (2 * GIB_HOUR_BYTE_SECONDS)
    whole, part = divmod(thousandths, 1000)
    return f"{whole}.{part:03d}"


def end_reasons(connection: Connection, account: str, period: str) -> dict[tuple[str, str], str]:
    """(gpupool job id, its end as invoice text) -> why gpupool ended it, for the account's jobs gpupool ended in the period."""
    year, month = (int(part) for part in period.split("-"))
    start = dt.datetime(year, month, 1, tzinfo=dt.UTC)
    rows = connection.execute(
        select(Job.id, Job.ended_at, Job.end_reason).where(
            Job.account == account, Job.end_reason.is_not(None), Job.ended_at >= start, Job.ended_at <= next_month_start(start)
        )
    )
    return {(job_id, utc_text(ended_at)): reason for job_id, ended_at, reason in rows if ended_at is not None and reason}


def invoice_lines(connection: Connection, account: str, period: str, currency: str) -> Iterator[list[tuple]]:
    """Every CSV line after the header, in batches; the total comes last."""
    totals = InvoiceTotals()
    price_text: dict[int, str] = {}
    currency = spreadsheet_text(currency)
    reasons = end_reasons(connection, account, period)
    for partition in job_line_groups(connection, account, period):
        batch = []
        for gpupool_id, slurm_id, name, gpu_type, gpus, start, end, seconds, gpu_seconds, price, tier, nanos in partition:
            cents = round_to_cents(nanos)
            totals.cents += cents
            totals.billed_seconds += seconds
            totals.gpu_seconds += gpu_seconds
            unit = price_text.get(price)
            if unit is None:
                unit = price_text[price] = format_nanos(price)
            batch.append(
                (
                    "job", gpupool_id or "", slurm_id, spreadsheet_text(name), spreadsheet_text(gpu_type), gpus,
                    # A tier is one the operator priced (``gpupool price set --tier``), never tenant text.
                    start, end, seconds, gpu_seconds, unit, format_cents(cents), currency, tier,
                    spreadsheet_text(reasons.get((gpupool_id, end), "")) if gpupool_id else "", "",
                )
            )
        totals.lines += len(batch)
        yield batch
    batch = []
    for line in storage_lines(connection, account, period):
        cents = round_to_cents(line.amount_nanos)
        totals.cents += cents
        batch.append(
            ("storage", "", "", "storage", "", "", utc_text(line.start), utc_text(line.end), line.seconds, "",
             format_nanos(line.nanos_per_gib_month), format_cents(cents), currency, "", "", gib_hours_text(line.byte_seconds))
        )
    totals.lines += len(batch)
    if batch:
        yield batch
    adjustments = connection.execute(
        select(Adjustment.id, Adjustment.created_at, Adjustment.reason, Adjustment.amount_nanos)
        .where(Adjustment.account == account, Adjustment.period == period)
        .order_by(Adjustment.created_at, Adjustment.id)
    )
    batch = []
    for adjustment_id, created_at, reason, nanos in adjustments:
        cents = round_to_cents(int(nanos))
        totals.cents += cents
        batch.append(("adjustment", f"adj-{adjustment_id}", "", spreadsheet_text(reason), "", "", utc_text(created_at), "", "", "", "", format_cents(cents), currency, "", "", ""))
    batch.append(
        ("total", "", "", "", "", "", "", "", totals.billed_seconds, totals.gpu_seconds, "", format_cents(totals.cents), currency, "", "", "")
    )
    yield batch


def invoice_csv_chunks(connection: Connection, account: str, period: str, currency: str) -> Iterator[str]:
    """RFC 4180 text (CRLF line ends, quotes doubled), one chunk per batch of lines."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(INVOICE_COLUMNS)
    for batch in invoice_lines(connection, account, period, currency):
        writer.writerows(batch)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()


def write_invoice(connection: Connection, account: str, period: str, currency: str, out: TextIO) -> None:
    for chunk in invoice_csv_chunks(connection, account, period, currency):
        out.write(chunk)


def invoice_filename(account: str, period: str) -> str:
    return f"gpupool-invoice-{account}-{period}.csv"


def invoice_total_cents(connection: Connection, account: str, period: str) -> tuple[int, int, int]:
    """(charges, adjustments, total) in cents, by the invoice's own rounding."""
    charges = invoiced_cents(group[-1] for partition in job_line_groups(connection, account, period) for group in partition)
    charges += invoiced_cents(line.amount_nanos for line in storage_lines(connection, account, period))
    adjustments = invoiced_cents(
        int(nanos)
        for (nanos,) in connection.execute(
            select(Adjustment.amount_nanos).where(Adjustment.account == account, Adjustment.period == period)
        )
    )
    return charges, adjustments, charges + adjustments
