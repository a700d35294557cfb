"""Revenue from the ledger, each row prorated to the seconds of it inside the window,
summed by account, GPU type, price tier (the row's own) and day; adjustments apart.

Money billed is counted as the invoices count it (``billing.money.invoiced_cents``): the
window's part of each invoice line (a run's rows of one account, month, GPU type, unit
price and tier, as ``billing.invoice`` groups them) is rounded to the cent, and the
totals by account, GPU type and tier are sums of those rounded lines; so is each
adjustment. A whole-month report therefore says what that month's invoices say. A day
is no invoice line: the revenue by day, and the revenue per run that payback attributes
to nodes, stay exact.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.calendar import month_start, next_month_start
from billing.money import format_cents, format_nanos, invoiced_cents
from billing.price_book import NORMAL_TIER
from billing.report.intervals import overlap_s
from gpupool.clock import utc_text
from gpupool.models import Adjustment, LedgerEntry, StorageCharge

_DAY = dt.timedelta(days=1)
RunId = tuple[int, dt.datetime]  # job id, run start: how a ledger run meets its sacct record


# An invoice line: account, period, cluster, job id, run start, GPU type, unit price, tier.
LineKey = tuple[str, str, str, int, dt.datetime, str, int, str]


@dataclass
class Sums:
    gpu_seconds: int = 0
    nanos: int = 0
    # The invoice lines' amounts, each rounded to the cent (LedgerWindow.round_lines fills it).
    cents: int = 0

    def add(self, gpu_seconds: int, nanos: int) -> None:
        self.gpu_seconds += gpu_seconds
        self.nanos += nanos

    def as_json(self) -> dict[str, Any]:
        """Exact: for what no invoice line is (a day)."""
        return {"gpu_seconds": self.gpu_seconds, "amount": format_nanos(self.nanos)}

    def as_invoiced_json(self) -> dict[str, Any]:
        return {"gpu_seconds": self.gpu_seconds, "amount": format_cents(self.cents)}


@dataclass
class LedgerWindow:
    """The ledger's rows, prorated to the window, summed every way the report shows them."""

    total: Sums = field(default_factory=Sums)
    by_account: dict[str, Sums] = field(default_factory=dict)
    by_gpu_type: dict[str, Sums] = field(default_factory=dict)
    by_tier: dict[str, Sums] = field(default_factory=dict)
    by_day: dict[dt.date, Sums] = field(default_factory=dict)
    by_day_and_type: dict[tuple[dt.date, str], int] = field(default_factory=dict)
    by_run: dict[RunId, int] = field(default_factory=dict)
    lines: dict[LineKey, int] = field(default_factory=dict)

    def round_lines(self) -> None:
        """Each invoice line's amount in the window, rounded to the cent, into the totals that partition the lines."""
        for key, nanos in self.lines.items():
            account, _period, _cluster, _job, _run, gpu_type, _price, tier = key
            cents = invoiced_cents((nanos,))
            for sums in (self.total, self.by_account[account], self.by_gpu_type[gpu_type], self.by_tier[tier]):
                sums.cents += cents


LedgerRowValues = (
    tuple[str, str, int, dt.datetime, dt.datetime, int, int, int, int, int, dt.datetime]
    | tuple[str, str, int, dt.datetime, dt.datetime, int, int, int, int, int, dt.datetime, str]
    | tuple[str, str, int, dt.datetime, dt.datetime, int, int, int, int, int, dt.datetime, str, str, str]
)


def sum_ledger_rows(rows: Iterable[LedgerRowValues], since: dt.datetime, end: dt.datetime) -> LedgerWindow:
    """(account, type, GPUs, from, to, seconds, GPU-seconds, price, amount, job id, run start[, tier[, cluster,
    period]]) rows, cut to [since, end). Rows without a tier are normal's; without a period, their start's month's."""
    sums = LedgerWindow()
    for account, gpu_type, gpus, start, stop, seconds, gpu_seconds, price, nanos, job_id_raw, run_start, *extra in rows:
        tier = extra[0] if extra else NORMAL_TIER
        cluster, period = (extra[1], extra[2]) if len(extra) == 3 else ("", f"{start:%Y-%m}")
        inside = overlap_s(start, stop, since, end)
        if inside == 0:
            continue
        sign = -1 if seconds < 0 else 1  # correction rows take seconds back
        if inside != abs(seconds):
            gpu_seconds = sign * gpus * inside
            nanos = gpu_seconds * price
        sums.total.add(gpu_seconds, nanos)
        sums.by_account.setdefault(account, Sums()).add(gpu_seconds, nanos)
        sums.by_gpu_type.setdefault(gpu_type, Sums()).add(gpu_seconds, nanos)
        sums.by_tier.setdefault(tier, Sums()).add(gpu_seconds, nanos)
        line: LineKey = (account, period, cluster, job_id_raw, run_start, gpu_type, price, tier)
        sums.lines[line] = sums.lines.get(line, 0) + nanos
        run = (job_id_raw, run_start)
        sums.by_run[run] = sums.by_run.get(run, 0) + nanos
        moment, stop = max(start, since), min(stop, end)
        while moment < stop:
            midnight = dt.datetime.combine(moment.date() + _DAY, dt.time(), tzinfo=dt.UTC)
            cut = min(stop, midnight)
            day_gpu_seconds = sign * gpus * int((cut - moment).total_seconds())
            sums.by_day.setdefault(moment.date(), Sums()).add(day_gpu_seconds, day_gpu_seconds * price)
            key = (moment.date(), gpu_type)
            sums.by_day_and_type[key] = sums.by_day_and_type.get(key, 0) + day_gpu_seconds
            moment = cut
    sums.round_lines()
    return sums


def _ledger_query(since: dt.datetime, end: dt.datetime) -> Any:
    entry = LedgerEntry
    return select(
        entry.account, entry.gpu_type, entry.gpus, entry.interval_from, entry.interval_to, entry.seconds,
        entry.gpu_seconds, entry.unit_price_nanos, entry.amount_nanos, entry.job_id_raw, entry.run_start, entry.tier,
        entry.cluster, entry.period,
    ).where(entry.interval_to > since, entry.interval_from < end)


def ledger_window(session: Session, since: dt.datetime, end: dt.datetime) -> LedgerWindow:
    result = session.connection().execute(_ledger_query(since, end), execution_options={"yield_per": 10_000})
    return sum_ledger_rows(result, since, end)


def window_adjustments(session: Session, since: dt.datetime, until: dt.datetime) -> dict[str, Any]:
    """Adjustments of the window: by invoice month when the window is whole months, else by when they were made."""
    query = select(Adjustment.account, Adjustment.period, Adjustment.kind, Adjustment.reason, Adjustment.amount_nanos, Adjustment.created_at)
    if since == month_start(since) and until == month_start(until):
        periods = []
        moment = since
        while moment < until:
            periods.append(f"{moment:%Y-%m}")
            moment = next_month_start(moment)
        query = query.where(Adjustment.period.in_(periods))
    else:
        query = query.where(Adjustment.created_at >= since, Adjustment.created_at < until)
    lines = []
    credits = charges = 0
    for account, period, kind, reason, nanos, created_at in session.execute(query.order_by(Adjustment.created_at, Adjustment.id)):
        cents = invoiced_cents((int(nanos),))  # each adjustment is an invoice line of its own
        if cents < 0:
            credits += cents
        else:
            charges += cents
        lines.append(
            {"account": account, "period": period, "kind": kind, "reason": reason, "amount": format_cents(cents), "created_at": utc_text(created_at)}
        )
    return {
        "credits": format_cents(credits),
        "charges": format_cents(charges),
        "total": format_cents(credits + charges),
        "lines": lines,
        "_cents": credits + charges,
    }


def lifetime_revenue_by_run(session: Session, start: dt.datetime, end: dt.datetime) -> dict[RunId, int]:
    """Revenue of every run that started in [start, end), counting its rows up to ``end``."""
    entry = LedgerEntry
    query = select(
        entry.account, entry.gpu_type, entry.gpus, entry.interval_from, entry.interval_to, entry.seconds,
        entry.gpu_seconds, entry.unit_price_nanos, entry.amount_nanos, entry.job_id_raw, entry.run_start,
    ).where(entry.run_start >= start, entry.run_start < end, entry.interval_from < end)
    result = session.connection().execute(query, execution_options={"yield_per": 10_000})
    return sum_ledger_rows(result, start, end).by_run


@dataclass
class StorageSums:
    byte_seconds: int = 0
    cents: int = 0


def storage_window(session: Session, since: dt.datetime, end: dt.datetime) -> dict[str, StorageSums]:
    """Storage charged per account for the hours that start in [since, end), each invoice line
    (account, month, price per GiB-month) rounded to the cent as ``billing.invoice`` rounds it."""
    charge = StorageCharge
    rows = session.execute(
        select(charge.account, charge.period, charge.nanos_per_gib_month, charge.byte_seconds, charge.amount_nanos).where(
            charge.interval_from >= since, charge.interval_from < end
        )
    )
    lines: dict[tuple[str, str, int], list[int]] = {}
    for account, period, price, byte_seconds, nanos in rows:
        line = lines.setdefault((account, period, price), [0, 0])
        line[0] += byte_seconds
        line[1] += nanos
    by_account: dict[str, StorageSums] = {}
    for (account, _period, _price), (byte_seconds, nanos) in lines.items():
        sums = by_account.setdefault(account, StorageSums())
        sums.byte_seconds += byte_seconds
        sums.cents += invoiced_cents((nanos,))
    return by_account
