"""Usage of one account in one month: GPU-seconds and money by GPU type and by UTC day."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from billing.budgets import balance
from billing.invoice import gib_hours_text, invoice_total_cents, storage_lines
from billing.money import format_cents, format_nanos
from gpupool.models import LedgerEntry

_DAY = dt.timedelta(days=1)


def _split_by_day(start: dt.datetime, end: dt.datetime) -> list[tuple[dt.date, int]]:
    pieces = []
    while start < end:
        midnight = dt.datetime.combine(start.date() + _DAY, dt.time(), tzinfo=dt.UTC)
        cut = min(end, midnight)
        pieces.append((start.date(), int((cut - start).total_seconds())))
        start = cut
    return pieces


def gpu_seconds_by_day_and_type(session: Session, account: str, period: str) -> dict[dt.date, dict[str, int]]:
    """GPU-seconds of one account's month per UTC day, split by GPU type (the usage page's stacked chart)."""
    by_day: dict[dt.date, dict[str, int]] = {}
    rows = session.connection().execute(
        select(LedgerEntry.gpu_type, LedgerEntry.gpus, LedgerEntry.interval_from, LedgerEntry.interval_to, LedgerEntry.gpu_seconds)
        .where(LedgerEntry.account == account, LedgerEntry.period == period)
    )
    for gpu_type, gpus, start, end, gpu_seconds in rows:
        sign = -1 if gpu_seconds < 0 else 1  # correction rows take seconds back
        for day, seconds in _split_by_day(start, end):
            types = by_day.setdefault(day, {})
            types[gpu_type] = types.get(gpu_type, 0) + sign * gpus * seconds
    return by_day


def usage(session: Session, account: str, period: str, currency: str, now: dt.datetime) -> dict[str, Any]:
    """The /usage document. Breakdown amounts are exact; ``total`` is rounded as the invoice is."""
    connection: Connection = session.connection()
    by_type: dict[str, list[int]] = {}
    by_day: dict[dt.date, list[int]] = {}
    rows = connection.execute(
        select(
            LedgerEntry.gpu_type,
            LedgerEntry.gpus,
            LedgerEntry.interval_from,
            LedgerEntry.interval_to,
            LedgerEntry.gpu_seconds,
            LedgerEntry.unit_price_nanos,
            LedgerEntry.amount_nanos,
        ).where(LedgerEntry.account == account, LedgerEntry.period == period)
    )
    for gpu_type, gpus, start, end, gpu_seconds, price, nanos in rows:
        totals = by_type.setdefault(gpu_type, [0, 0])
        totals[0] += gpu_seconds
        totals[1] += nanos
        sign = -1 if gpu_seconds < 0 else 1  # correction rows take seconds back
        for day, seconds in _split_by_day(start, end):
            day_totals = by_day.setdefault(day, [0, 0])
            day_totals[0] += sign * gpus * seconds
            day_totals[1] += sign * gpus * seconds * price
    charges, adjustments, total = invoice_total_cents(connection, account, period)
    storage = storage_lines(connection, account, period)
    storage_byte_seconds = sum(line.byte_seconds for line in storage)
    return {
        "account": account,
        "period": period,
        "currency": currency,
        "gpu_seconds": sum(values[0] for values in by_type.values()),
        "charges": format_cents(charges),
        "adjustments": format_cents(adjustments),
        "total": format_cents(total),
        "by_gpu_type": [
            {"gpu_type": gpu_type, "gpu_seconds": values[0], "amount": format_nanos(values[1])}
            for gpu_type, values in sorted(by_type.items())
        ],
        "by_day": [
            {"date": day.isoformat(), "gpu_seconds": values[0], "amount": format_nanos(values[1])}
            for day, values in sorted(by_day.items())
        ],
        "balance": balance(session, account, now).as_json(),
        "storage_billed": {
            "byte_seconds": storage_byte_seconds,
            "gib_hours": gib_hours_text(storage_byte_seconds),
            "amount": format_nanos(sum(line.amount_nanos for line in storage)),
        },
    }
