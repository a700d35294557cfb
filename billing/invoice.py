"""Invoices: one CSV line per job run per period, adjustment lines, then the total.

Lines come from one GROUP BY streamed off a server-side cursor, so memory
stays flat however many lines an invoice has. A line groups a run's ledger
rows of one GPU type and one unit price (a price change mid-run gives the
run a second line). Its amount is rounded once (``billing.money``), and the
total is the sum of the rounded lines. Order is fixed: job lines by billed
start, then cluster, job id, run start, type, price; adjustments by time.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from billing.money import format_cents, format_nanos, round_to_cents
from gpupool.errors import BadRequest
from gpupool.models import Adjustment, LedgerEntry

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
)
PERIOD = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")
_BATCH = 10_000


def check_period(text: str) -> str:
    if not PERIOD.match(text or ""):
        raise BadRequest(f"period {text!r} is not a month in the form YYYY-MM", code="bad_period")
    return text


def _utc_text(moment: dt.datetime) -> str:
    return moment.isoformat()[:19] + "Z"


@dataclass
class InvoiceTotals:
    lines: int = 0
    billed_seconds: int = 0
    gpu_seconds: int = 0
    cents: int = 0


def job_line_groups(connection: Connection, account: str, period: str) -> Iterator[tuple]:
    """Per job run, type and price: ids, name, GPUs, first second, net seconds, GPU-seconds, price, nanos.

    A run's usage within one period is one contiguous span, so it ends at
    start + net seconds (correction rows included).
    """
    entry = LedgerEntry
    query = (
        select(
            func.max(entry.gpupool_job_id),
            func.max(entry.slurm_job_id),
            func.max(entry.job_name),
            entry.gpu_type,
            func.max(entry.gpus),
            func.min(entry.interval_from),
            func.sum(entry.seconds),
            func.sum(entry.gpu_seconds),
            entry.unit_price_nanos,
            func.sum(entry.amount_nanos),
        )
        .where(entry.account == account, entry.period == period)
        .group_by(entry.cluster, entry.job_id_raw, entry.run_start, entry.gpu_type, entry.unit_price_nanos)
        .order_by(
            func.min(entry.interval_from),
            entry.cluster,
            entry.job_id_raw,
            entry.run_start,
            entry.gpu_type,
            entry.unit_price_nanos,
        )
    )
    # Per statement: Connection.execution_options would change the connection itself.
    result = connection.execute(query, execution_options={"stream_results": True, "yield_per": _BATCH})
    for partition in result.partitions(_BATCH):
        yield from partition


def invoice_lines(connection: Connection, account: str, period: str, currency: str) -> Iterator[tuple]:
    """Every CSV line after the header, the total last."""
    totals = InvoiceTotals()
    price_text: dict[int, str] = {}
    for gpupool_id, slurm_id, name, gpu_type, gpus, start, seconds, gpu_seconds, price, nanos in job_line_groups(
        connection, account, period
    ):
        cents = round_to_cents(int(nanos))
        seconds, gpu_seconds = int(seconds), int(gpu_seconds)
        end = start + dt.timedelta(seconds=seconds)
        totals.lines += 1
        totals.billed_seconds += seconds
        totals.gpu_seconds += gpu_seconds
        totals.cents += cents
        unit = price_text.get(price)
        if unit is None:
            unit = price_text[price] = format_nanos(price)
        yield (
            "job",
            gpupool_id or "",
            slurm_id,
            name,
            gpu_type,
            gpus,
            _utc_text(start),
            _utc_text(end),
            seconds,
            gpu_seconds,
            unit,
            format_cents(cents),
            currency,
        )
    adjustments = connection.execute(
        select(Adjustment.id, Adjustment.created_at, Adjustment.reason, Adjustment.amount_nanos)
        .where(Adjustment.account == account, Adjustment.period == period)
        .order_by(Adjustment.created_at, Adjustment.id)
    )
    for adjustment_id, created_at, reason, nanos in adjustments:
        cents = round_to_cents(int(nanos))
        totals.cents += cents
        yield ("adjustment", f"adj-{adjustment_id}", "", reason, "", "", _utc_text(created_at), "", "", "", "", format_cents(cents), currency)
    yield ("total", "", "", "", "", "", "", "", totals.billed_seconds, totals.gpu_seconds, "", format_cents(totals.cents), currency)


def invoice_csv_chunks(connection: Connection, account: str, period: str, currency: str) -> Iterator[str]:
    """RFC 4180 text (CRLF line ends, quotes doubled) in chunks of about a thousand lines."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(INVOICE_COLUMNS)
    count = 0
    for line in invoice_lines(connection, account, period, currency):
        writer.writerow(line)
        count += 1
        if count % 1000 == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def write_invoice(connection: Connection, account: str, period: str, currency: str, out: TextIO) -> None:
    for chunk in invoice_csv_chunks(connection, account, period, currency):
        out.write(chunk)


def invoice_filename(account: str, period: str) -> str:
    return f"gpupool-invoice-{account}-{period}.csv"


def invoice_total_cents(connection: Connection, account: str, period: str) -> tuple[int, int, int]:
    """(charges, adjustments, total) in cents, by the invoice's own rounding."""
    charges = sum(round_to_cents(int(group[-1])) for group in job_line_groups(connection, account, period))
    adjustments = sum(
        round_to_cents(int(nanos))
        for (nanos,) in connection.execute(
            select(Adjustment.amount_nanos).where(Adjustment.account == account, Adjustment.period == period)
        )
    )
    return charges, adjustments, charges + adjustments
