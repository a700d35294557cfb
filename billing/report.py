"""The operator report: revenue, utilization, queue wait and payback over a window.

Where each figure comes from:
- revenue, GPU-hours sold: the ledger, each row prorated to the seconds of it
  inside the window (rows are exact, so a row wholly inside counts as billed);
  by account, GPU type, price tier (normal or spot: the row's own) and day;
- adjustments: the ``adjustments`` table, apart from revenue;
- utilization: sacct's allocations (``AllocTRES`` GPUs x the seconds of
  [Start, End) inside the window, split over the job's nodes) over what the
  nodes sinfo lists could give: GPUs x seconds, less the time slurmdbd's events
  have a node down or drained (``sacctmgr show event``), as ``sreport`` does;
- queue wait: Start - Submit of every run that started in the window (sacct);
- waiting now: squeue's pending jobs and Slurm's reason;
- payback: ``node_costs`` (``gpupool node cost set``) and the
  ``electricity_price_per_kwh`` setting, against the revenue of the runs each
  node ran (a ledger run is found in sacct by job id and start).

Money stays in nano-units throughout; rounding to the cent happens only when a
figure is displayed (table and CSV), half away from zero, as on invoices.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.invoice import PERIOD, check_period, spreadsheet_text
from billing.meter import NORMAL_TIER, month_start, next_month_start
from billing.money import format_cents, format_nanos, parse_nanos, round_to_cents
from gpupool.config import Settings
from gpupool.errors import BadRequest
from gpupool.models import Adjustment, LedgerEntry, NodeCost
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import UNTYPED_GPU
from gpupool.slurm.report import Allocation, NodeEvent, NodeGpuCapacity, PendingJob

# An average Gregorian month (365.2425 days / 12): "per month" rates use it.
AVERAGE_MONTH_S = 2_629_746
# Watt-seconds in a kilowatt-hour.
_WS_PER_KWH = 3_600_000
MAX_WINDOW = dt.timedelta(days=400)
_DAY = dt.timedelta(days=1)
RunId = tuple[int, dt.datetime]  # job id, run start: how a ledger run meets its sacct record


# -- the window ---------------------------------------------------------------------


def _moment(value: str | dt.datetime, what: str) -> dt.datetime:
    if isinstance(value, dt.datetime):
        moment = value
    else:
        try:
            moment = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise BadRequest(f"{what} {value!r} is not an ISO 8601 time such as 2026-12-01T00:00:00Z", code="bad_window") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)  # no zone: UTC, as everywhere in gpupool
    return moment.astimezone(dt.UTC)


def parse_window(
    period: str | None = None,
    since: str | dt.datetime | None = None,
    until: str | dt.datetime | None = None,
    *,
    now: dt.datetime,
) -> tuple[dt.datetime, dt.datetime]:
    """[since, until) of a report: a UTC month (``period``, default this month), or a range.

    ``since`` alone runs to ``now``. Raises BadRequest (``bad_period``/``bad_window``).
    """
    if period and (since or until):
        raise BadRequest("give a period or a since/until range, not both", code="bad_window")
    if since is None and until is None:
        month = check_period(period) if period else f"{now:%Y-%m}"
        match = PERIOD.match(month)
        assert match is not None
        start = dt.datetime(int(match[1]), int(match[2]), 1, tzinfo=dt.UTC)
        return start, next_month_start(start)
    if since is None:
        raise BadRequest("until needs a since", code="bad_window")
    start = _moment(since, "since")
    end = _moment(until, "until") if until is not None else now.astimezone(dt.UTC)
    if start >= end:
        raise BadRequest("since must be before until", code="bad_window")
    if end - start > MAX_WINDOW:
        raise BadRequest(f"a report covers at most {MAX_WINDOW.days} days", code="bad_window")
    return start, end


# -- pure arithmetic ------------------------------------------------------------------


def overlap_s(start: dt.datetime, end: dt.datetime, window_start: dt.datetime, window_end: dt.datetime) -> int:
    """Whole seconds of [start, end) inside [window_start, window_end)."""
    seconds = (min(end, window_end) - max(start, window_start)).total_seconds()
    return int(seconds) if seconds > 0 else 0


def union_s(spans: Iterable[tuple[dt.datetime, dt.datetime]], window_start: dt.datetime, window_end: dt.datetime) -> int:
    """Seconds of the window covered by at least one span: overlapping events count once."""
    clipped = sorted((max(a, window_start), min(b, window_end)) for a, b in spans if b > window_start and a < window_end)
    total, reach = 0, window_start
    for start, end in clipped:
        start = max(start, reach)
        if end > start:
            total += int((end - start).total_seconds())
            reach = end
    return total


def percentile(values: Sequence[int], percent: int) -> int | None:
    """Nearest rank: the smallest value with at least ``percent`` % of values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = -(-percent * len(ordered) // 100)  # ceil without floats
    return ordered[max(rank, 1) - 1]


def ratio(numerator: int, denominator: int, places: int = 4) -> str | None:
    """``numerator / denominator`` as decimal text, half up; None when there is nothing to divide by."""
    if denominator <= 0:
        return None
    return str((Decimal(numerator) / Decimal(denominator)).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP))


def _divide_half_up(numerator: int, denominator: int) -> int:
    quotient, rest = divmod(abs(numerator), denominator)
    if rest * 2 >= denominator:
        quotient += 1
    return -quotient if numerator < 0 else quotient


def energy_nanos(watts: int, seconds: int, price_per_kwh_nanos: int) -> int:
    """Electricity cost of ``watts`` for ``seconds``, to the nano-unit."""
    return _divide_half_up(watts * seconds * price_per_kwh_nanos, _WS_PER_KWH)


def gpu_hours(gpu_seconds: int) -> str:
    """GPU-seconds as hours with 2 decimals, half away from zero."""
    hundredths = _divide_half_up(gpu_seconds * 100, 3600)
    sign = "-" if hundredths < 0 else ""
    whole, part = divmod(abs(hundredths), 100)
    return f"{sign}{whole}.{part:02d}"


def months_to_payback(still_owed_nanos: int, monthly_margin_nanos: int) -> str | None:
    """Months until the margin covers what is still owed: "0.0" once paid back, None at no margin."""
    if still_owed_nanos <= 0:
        return "0.0"
    if monthly_margin_nanos <= 0:
        return None
    return str((Decimal(still_owed_nanos) / Decimal(monthly_margin_nanos)).quantize(Decimal("0.1"), ROUND_HALF_UP))


def split_count(count: int, parts: int) -> list[int]:
    """``count`` over ``parts`` as evenly as integers allow, the remainder to the first."""
    base, extra = divmod(count, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


def gpus_on_nodes(allocation: Allocation, node_types: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """(node, GPU type, GPUs) of an allocation. sacct gives totals only, so a multi-node job's GPUs
    are split evenly over its nodes (what ``--gres=gpu:N`` allocates); an untyped count takes the
    type of a node that has only one."""
    nodes = allocation.nodes or ("",)
    cells: list[tuple[str, str, int]] = []
    for gpu_type, count in allocation.gpus.items():
        for node, share in zip(nodes, split_count(count, len(nodes)), strict=True):
            if share == 0:
                continue
            known = node_types.get(node, {})
            resolved = next(iter(known)) if gpu_type == UNTYPED_GPU and len(known) == 1 else gpu_type
            cells.append((node, resolved, share))
    return cells


# -- the report -----------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """Every figure of one window; ``as_json`` is what ``GET /admin/report`` answers.

    Amounts are exact decimal text (``format_nanos``); GPU-seconds are integers.
    ``measured_until`` is min(until, now): nothing after it is counted.
    """

    since: dt.datetime
    until: dt.datetime
    measured_until: dt.datetime
    generated_at: dt.datetime
    currency: str
    revenue: dict[str, Any]
    revenue_by_account: list[dict[str, Any]]
    revenue_by_gpu_type: list[dict[str, Any]]
    revenue_by_day: list[dict[str, Any]]
    adjustments: dict[str, Any]
    gpu_seconds_sold: int
    gpu_hours_sold: str
    utilization: dict[str, Any]
    utilization_by_node: list[dict[str, Any]]
    utilization_by_gpu_type: list[dict[str, Any]]
    queue_wait: dict[str, Any]
    waiting_now: list[dict[str, Any]]
    payback: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    # Full price (normal) and spot: the tier each ledger row was priced at.
    revenue_by_tier: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "since": _utc_text(self.since),
            "until": _utc_text(self.until),
            "measured_until": _utc_text(self.measured_until),
            "generated_at": _utc_text(self.generated_at),
            "currency": self.currency,
            "revenue": self.revenue,
            "revenue_by_account": self.revenue_by_account,
            "revenue_by_gpu_type": self.revenue_by_gpu_type,
            "revenue_by_tier": self.revenue_by_tier,
            "revenue_by_day": self.revenue_by_day,
            "adjustments": self.adjustments,
            "gpu_seconds_sold": self.gpu_seconds_sold,
            "gpu_hours_sold": self.gpu_hours_sold,
            "utilization": self.utilization,
            "utilization_by_node": self.utilization_by_node,
            "utilization_by_gpu_type": self.utilization_by_gpu_type,
            "queue_wait": self.queue_wait,
            "waiting_now": self.waiting_now,
            "payback": self.payback,
            "notes": self.notes,
        }


def _utc_text(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Sums:
    gpu_seconds: int = 0
    nanos: int = 0

    def add(self, gpu_seconds: int, nanos: int) -> None:
        self.gpu_seconds += gpu_seconds
        self.nanos += nanos

    def as_json(self) -> dict[str, Any]:
        return {"gpu_seconds": self.gpu_seconds, "amount": format_nanos(self.nanos)}


@dataclass
class LedgerWindow:
    """The ledger's rows, prorated to the window, summed every way the report shows them."""

    total: _Sums = field(default_factory=_Sums)
    by_account: dict[str, _Sums] = field(default_factory=dict)
    by_gpu_type: dict[str, _Sums] = field(default_factory=dict)
    by_tier: dict[str, _Sums] = field(default_factory=dict)
    by_day: dict[dt.date, _Sums] = field(default_factory=dict)
    by_day_and_type: dict[tuple[dt.date, str], int] = field(default_factory=dict)
    by_run: dict[RunId, int] = field(default_factory=dict)


LedgerRowValues = (
    tuple[str, str, int, dt.datetime, dt.datetime, int, int, int, int, int, dt.datetime]
    | tuple[str, str, int, dt.datetime, dt.datetime, int, int, int, int, int, dt.datetime, str]
)


def sum_ledger_rows(rows: Iterable[LedgerRowValues], since: dt.datetime, end: dt.datetime) -> LedgerWindow:
    """(account, type, GPUs, from, to, seconds, GPU-seconds, price, amount, job id, run start[, tier]) rows,
    cut to [since, end). Rows without a tier are normal's."""
    sums = LedgerWindow()
    for account, gpu_type, gpus, start, stop, seconds, gpu_seconds, price, nanos, job_id_raw, run_start, *tier in rows:
        inside = overlap_s(start, stop, since, end)
        if inside == 0:
            continue
        sign = -1 if seconds < 0 else 1  # correction rows take seconds back
        if inside != abs(seconds):
            gpu_seconds = sign * gpus * inside
            nanos = gpu_seconds * price
        sums.total.add(gpu_seconds, nanos)
        sums.by_account.setdefault(account, _Sums()).add(gpu_seconds, nanos)
        sums.by_gpu_type.setdefault(gpu_type, _Sums()).add(gpu_seconds, nanos)
        sums.by_tier.setdefault(tier[0] if tier else NORMAL_TIER, _Sums()).add(gpu_seconds, nanos)
        run = (job_id_raw, run_start)
        sums.by_run[run] = sums.by_run.get(run, 0) + nanos
        moment, stop = max(start, since), min(stop, end)
        while moment < stop:
            midnight = dt.datetime.combine(moment.date() + _DAY, dt.time(), tzinfo=dt.UTC)
            cut = min(stop, midnight)
            day_gpu_seconds = sign * gpus * int((cut - moment).total_seconds())
            sums.by_day.setdefault(moment.date(), _Sums()).add(day_gpu_seconds, day_gpu_seconds * price)
            key = (moment.date(), gpu_type)
            sums.by_day_and_type[key] = sums.by_day_and_type.get(key, 0) + day_gpu_seconds
            moment = cut
    return sums


def _ledger_query(since: dt.datetime, end: dt.datetime) -> Any:
    entry = LedgerEntry
    return select(
        entry.account, entry.gpu_type, entry.gpus, entry.interval_from, entry.interval_to, entry.seconds,
        entry.gpu_seconds, entry.unit_price_nanos, entry.amount_nanos, entry.job_id_raw, entry.run_start, entry.tier,
    ).where(entry.interval_to > since, entry.interval_from < end)


def _ledger_window(session: Session, since: dt.datetime, end: dt.datetime) -> LedgerWindow:
    result = session.connection().execute(_ledger_query(since, end), execution_options={"yield_per": 10_000})
    return sum_ledger_rows(result, since, end)


@dataclass
class Cell:
    """One GPU type on one node: what it could give, what was down, what was allocated."""

    gpus: int = 0
    possible: int = 0
    unavailable: int = 0
    allocated: int = 0

    def settle(self) -> None:
        # As slurmdbd's roll-up does: time a job held a GPU is allocated even on a node
        # marked drained, so down time shrinks to what the allocations leave.
        self.unavailable = max(0, min(self.unavailable, self.possible - self.allocated))

    @property
    def available(self) -> int:
        return self.possible - self.unavailable


def utilization_cells(
    nodes: Sequence[NodeGpuCapacity],
    allocations: Iterable[Allocation],
    events: Sequence[NodeEvent],
    since: dt.datetime,
    end: dt.datetime,
) -> dict[tuple[str, str], Cell]:
    """(node, GPU type) -> GPU-seconds possible, down or drained, and allocated in [since, end)."""
    # The cluster counts from its first registration with slurmdbd, as sreport's Reported does.
    registered = [event.start for event in events if event.is_cluster]
    counted_from = max(since, min(registered)) if registered else since
    cluster_down = [(e.start, e.end or end) for e in events if e.is_cluster and "DOWN" in e.state.upper()]
    cells: dict[tuple[str, str], Cell] = {}
    for node in nodes:
        node_spans = cluster_down + [(e.start, e.end or end) for e in events if not e.is_cluster and e.node == node.name]
        down_s = union_s(node_spans, counted_from, end)
        for gpu_type, count in node.gpus.items():
            cells[(node.name, gpu_type)] = Cell(
                gpus=count,
                possible=count * overlap_s(counted_from, end, since, end),
                unavailable=count * down_s,
            )
    node_types = {node.name: node.gpus for node in nodes}
    for allocation in allocations:
        if allocation.started_at is None or not allocation.gpus:
            continue
        seconds = overlap_s(allocation.started_at, allocation.ended_at or end, since, end)
        if seconds == 0:
            continue
        for node_name, gpu_type, gpus in gpus_on_nodes(allocation, node_types):
            cells.setdefault((node_name, gpu_type), Cell()).allocated += gpus * seconds
    for cell in cells.values():
        cell.settle()
    return cells


def _utilization_line(key: str, value: str, cells: Iterable[Cell], **extra: Any) -> dict[str, Any]:
    cells = list(cells)
    allocated = sum(cell.allocated for cell in cells)
    available = sum(cell.available for cell in cells)
    return {
        key: value,
        **extra,
        "gpus": sum(cell.gpus for cell in cells),
        "allocated_gpu_seconds": allocated,
        "available_gpu_seconds": available,
        "down_gpu_seconds": sum(cell.unavailable for cell in cells),
        "utilization": ratio(allocated, available),
    }


def queue_waits(
    allocations: Iterable[Allocation], node_types: dict[str, dict[str, int]], since: dt.datetime, end: dt.datetime
) -> dict[str, Any]:
    """p50/p95 of Start - Submit over the GPU runs that started in [since, end), overall, by type and by account."""
    overall: list[int] = []
    by_type: dict[str, list[int]] = {}
    by_account: dict[str, list[int]] = {}
    for allocation in allocations:
        started, submitted = allocation.started_at, allocation.submitted_at
        if started is None or submitted is None or not allocation.gpus or not since <= started < end:
            continue
        wait = max(0, int((started - submitted).total_seconds()))
        overall.append(wait)
        by_account.setdefault(allocation.account, []).append(wait)
        for gpu_type in sorted({cell[1] for cell in gpus_on_nodes(allocation, node_types)}):
            by_type.setdefault(gpu_type, []).append(wait)

    def line(values: list[int]) -> dict[str, Any]:
        return {"jobs": len(values), "p50_s": percentile(values, 50), "p95_s": percentile(values, 95), "max_s": max(values, default=None)}

    return {
        "all": line(overall),
        "by_gpu_type": [{"gpu_type": name, **line(values)} for name, values in sorted(by_type.items())],
        "by_account": [{"account": name, **line(values)} for name, values in sorted(by_account.items())],
    }


def _adjustments(session: Session, since: dt.datetime, until: dt.datetime) -> dict[str, Any]:
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
        nanos = int(nanos)
        if nanos < 0:
            credits += nanos
        else:
            charges += nanos
        lines.append(
            {"account": account, "period": period, "kind": kind, "reason": reason, "amount": format_nanos(nanos), "created_at": _utc_text(created_at)}
        )
    return {
        "credits": format_nanos(credits),
        "charges": format_nanos(charges),
        "total": format_nanos(credits + charges),
        "lines": lines,
        "_nanos": credits + charges,
    }


def _lifetime_revenue_by_run(session: Session, start: dt.datetime, end: dt.datetime) -> dict[RunId, int]:
    """Revenue of every run that started in [start, end), counting its rows up to ``end``."""
    entry = LedgerEntry
    query = select(
        entry.account, entry.gpu_type, entry.gpus, entry.interval_from, entry.interval_to, entry.seconds,
        entry.gpu_seconds, entry.unit_price_nanos, entry.amount_nanos, entry.job_id_raw, entry.run_start,
    ).where(entry.run_start >= start, entry.run_start < end, entry.interval_from < end)
    result = session.connection().execute(query, execution_options={"yield_per": 10_000})
    return sum_ledger_rows(result, start, end).by_run


def attribute_to_nodes(
    revenue_by_run: dict[RunId, int], allocations: Iterable[Allocation], node_types: dict[str, dict[str, int]]
) -> tuple[dict[str, int], int]:
    """Each run's revenue split over its nodes by their share of its GPUs; and what sacct has no run for."""
    by_node: dict[str, int] = {}
    remaining = dict(revenue_by_run)
    for allocation in allocations:
        if allocation.started_at is None:
            continue
        nanos = remaining.pop((allocation.job_id_raw, allocation.started_at), None)
        if nanos is None:
            continue
        cells = gpus_on_nodes(allocation, node_types)
        total = sum(count for _node, _type, count in cells)
        if total == 0:
            remaining[(allocation.job_id_raw, allocation.started_at)] = nanos
            continue
        given = 0
        for index, (node, _gpu_type, count) in enumerate(cells):
            share = nanos - given if index == len(cells) - 1 else nanos * count // total
            given += share
            by_node[node] = by_node.get(node, 0) + share
    return by_node, sum(remaining.values())


@dataclass(frozen=True)
class NodePayback:
    node: str
    purchase_price_nanos: int
    in_service_since: dt.datetime
    watts: int


def payback_figures(
    costs: Sequence[NodePayback],
    revenue_to_date: dict[str, int],
    revenue_in_window: dict[str, int],
    price_per_kwh_nanos: int,
    since: dt.datetime,
    end: dt.datetime,
) -> dict[str, Any]:
    """Cost to date, revenue, margin and months to payback per node and in total (all nano-units)."""
    lines = []
    totals = dict.fromkeys(
        ("purchase", "electricity_to_date", "cost_to_date", "revenue_to_date", "revenue", "electricity", "margin", "monthly_margin"), 0
    )
    for cost in costs:
        in_service_s = overlap_s(cost.in_service_since, end, cost.in_service_since, end)
        window_s = overlap_s(cost.in_service_since, end, since, end)
        electricity_to_date = energy_nanos(cost.watts, in_service_s, price_per_kwh_nanos)
        electricity = energy_nanos(cost.watts, window_s, price_per_kwh_nanos)
        revenue = revenue_in_window.get(cost.node, 0)
        margin = revenue - electricity
        monthly_margin = _divide_half_up(margin * AVERAGE_MONTH_S, window_s) if window_s else 0
        figures = {
            "purchase": cost.purchase_price_nanos,
            "electricity_to_date": electricity_to_date,
            "cost_to_date": cost.purchase_price_nanos + electricity_to_date,
            "revenue_to_date": revenue_to_date.get(cost.node, 0),
            "revenue": revenue,
            "electricity": electricity,
            "margin": margin,
            "monthly_margin": monthly_margin,
        }
        for key, value in figures.items():
            totals[key] += value
        lines.append({"node": cost.node, "in_service_since": _utc_text(cost.in_service_since), "watts": cost.watts, **_payback_json(figures)})
    return {"nodes": lines, "total": _payback_json(totals), "electricity_price_per_kwh": format_nanos(price_per_kwh_nanos)}


def _payback_json(figures: dict[str, int]) -> dict[str, Any]:
    margin_to_date = figures["revenue_to_date"] - figures["cost_to_date"]
    return {
        "purchase_price": format_nanos(figures["purchase"]),
        "electricity_to_date": format_nanos(figures["electricity_to_date"]),
        "cost_to_date": format_nanos(figures["cost_to_date"]),
        "revenue_to_date": format_nanos(figures["revenue_to_date"]),
        "margin_to_date": format_nanos(margin_to_date),
        "revenue": format_nanos(figures["revenue"]),
        "electricity": format_nanos(figures["electricity"]),
        "margin": format_nanos(figures["margin"]),
        "monthly_margin": format_nanos(figures["monthly_margin"]),
        "paid_back": margin_to_date >= 0,
        "months_to_payback": months_to_payback(-margin_to_date, figures["monthly_margin"]),
    }


def _waiting_now(pending: Sequence[PendingJob], now: dt.datetime) -> list[dict[str, Any]]:
    waiting = [
        {
            "slurm_job_id": job.slurm_job_id,
            "account": job.account,
            "user": job.user,
            "gpus": job.gpus,
            "gpu_type": job.gpu_type,
            "reason": job.reason,
            "submitted_at": _utc_text(job.submitted_at) if job.submitted_at else None,
            "waiting_s": max(0, int((now - job.submitted_at).total_seconds())) if job.submitted_at else None,
        }
        for job in pending
    ]
    return sorted(waiting, key=lambda job: -(job["waiting_s"] or 0))


def build_report(
    session: Session, slurm: SlurmClient, settings: Settings, since: dt.datetime, until: dt.datetime, now: dt.datetime
) -> Report:
    """Every figure of [since, until), measured up to ``now``; reads the ledger, sacct, sacctmgr, sinfo and squeue."""
    end = max(since, min(until, now))
    costs = [
        NodePayback(row.node, row.purchase_price_nanos, row.in_service_since, row.watts)
        for row in session.scalars(select(NodeCost).order_by(NodeCost.node))
    ]
    # One sacct call serves the window and every node's life so far (payback attribution).
    history_start = min([since, *(cost.in_service_since for cost in costs)])
    nodes = slurm.node_gpus()
    node_types = {node.name: node.gpus for node in nodes}
    allocations = slurm.allocations(history_start, end) if end > history_start else []
    events = slurm.node_events(since, end) if end > since else []
    pending = slurm.pending_jobs()

    ledger = _ledger_window(session, since, end)
    adjustments = _adjustments(session, since, until)
    adjustment_nanos = adjustments.pop("_nanos")

    cells = utilization_cells(nodes, allocations, events, since, end)
    node_names = sorted({node for node, _type in cells})
    type_names = sorted({gpu_type for _node, gpu_type in cells})
    states = {node.name: node.state for node in nodes}
    by_node = [
        _utilization_line(
            "node", name, (cell for (node, _t), cell in cells.items() if node == name),
            gpu_types={t: cell.gpus for (node, t), cell in sorted(cells.items()) if node == name and cell.gpus},
            state=states.get(name),
        )
        for name in node_names
    ]
    by_type = [_utilization_line("gpu_type", name, (cell for (_n, t), cell in cells.items() if t == name)) for name in type_names]

    window_by_node, unattributed_window = attribute_to_nodes(ledger.by_run, allocations, node_types)
    revenue_to_date: dict[str, int] = {}
    lifetime = _lifetime_revenue_by_run(session, history_start, end) if costs and end > history_start else {}
    for cost in costs:
        # A node earns from the runs that started once it was in service.
        runs = {run: nanos for run, nanos in lifetime.items() if run[1] >= cost.in_service_since}
        revenue_to_date[cost.node] = attribute_to_nodes(runs, allocations, node_types)[0].get(cost.node, 0)
    price_per_kwh = parse_nanos(settings.electricity_price_per_kwh, what="electricity_price_per_kwh")
    payback = payback_figures(costs, revenue_to_date, window_by_node, price_per_kwh, since, end)
    payback["unattributed_revenue"] = format_nanos(unattributed_window)

    notes = []
    if not costs:
        notes.append("no node costs are set: `gpupool node cost set NODE --price ... --since ... --watts ...` gives payback figures")
    if unattributed_window:
        notes.append("some revenue is from runs sacct has no record of (imported history, or another cluster): it counts towards no node")
    return Report(
        since=since,
        until=until,
        measured_until=end,
        generated_at=now,
        currency=settings.currency,
        revenue={
            "gpu_seconds": ledger.total.gpu_seconds,
            "amount": format_nanos(ledger.total.nanos),
            "adjustments": format_nanos(adjustment_nanos),
            "net": format_nanos(ledger.total.nanos + adjustment_nanos),
        },
        revenue_by_account=[{"account": name, **sums.as_json()} for name, sums in sorted(ledger.by_account.items())],
        revenue_by_gpu_type=[{"gpu_type": name, **sums.as_json()} for name, sums in sorted(ledger.by_gpu_type.items())],
        revenue_by_tier=[{"tier": name, **sums.as_json()} for name, sums in sorted(ledger.by_tier.items())],
        revenue_by_day=[
            {
                "date": day.isoformat(),
                **sums.as_json(),
                "gpu_seconds_by_gpu_type": {t: s for (d, t), s in sorted(ledger.by_day_and_type.items()) if d == day},
            }
            for day, sums in sorted(ledger.by_day.items())
        ],
        adjustments=adjustments,
        gpu_seconds_sold=ledger.total.gpu_seconds,
        gpu_hours_sold=gpu_hours(ledger.total.gpu_seconds),
        utilization=_utilization_line("scope", "cluster", cells.values()),
        utilization_by_node=by_node,
        utilization_by_gpu_type=by_type,
        queue_wait=queue_waits(allocations, node_types, since, end),
        waiting_now=_waiting_now(pending, now),
        payback=payback,
        notes=notes,
    )


# -- display --------------------------------------------------------------------------


def cents_text(amount: str) -> str:
    """An exact amount as the invoice would print it: to the cent, half away from zero."""
    return format_cents(round_to_cents(parse_nanos(amount)))


def _percent(value: str | None) -> str:
    return "-" if value is None else f"{Decimal(value) * 100:.1f}%"


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(value) if value is not None else "-" for value in row] for row in rows]
    widths = [max(len(str(h)), *(len(row[i]) for row in cells)) if cells else len(str(h)) for i, h in enumerate(header)]
    lines = ["", title]
    lines.append("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    lines.extend("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
    if not cells:
        lines.append("(none)")
    return lines


def report_table(report: Report) -> str:
    """The report for a terminal: amounts rounded to the cent, utilization in percent."""
    data = report.as_json()
    currency = report.currency
    out = [
        f"gpupool report {data['since']} .. {data['until']} (measured until {data['measured_until']}), amounts in {currency}",
        f"revenue {cents_text(data['revenue']['amount'])}, adjustments {cents_text(data['revenue']['adjustments'])}, "
        f"net {cents_text(data['revenue']['net'])}; GPU-hours sold {data['gpu_hours_sold']}; "
        f"utilization {_percent(data['utilization']['utilization'])}",
    ]
    out += _table("Revenue by account", ("account", "gpu_hours", "amount"), [(r["account"], gpu_hours(r["gpu_seconds"]), cents_text(r["amount"])) for r in data["revenue_by_account"]])
    out += _table("Revenue by GPU type", ("gpu_type", "gpu_hours", "amount"), [(r["gpu_type"], gpu_hours(r["gpu_seconds"]), cents_text(r["amount"])) for r in data["revenue_by_gpu_type"]])
    out += _table("Revenue by price tier", ("tier", "gpu_hours", "amount"), [(r["tier"], gpu_hours(r["gpu_seconds"]), cents_text(r["amount"])) for r in data["revenue_by_tier"]])
    out += _table("Revenue by day (UTC)", ("date", "gpu_hours", "amount"), [(r["date"], gpu_hours(r["gpu_seconds"]), cents_text(r["amount"])) for r in data["revenue_by_day"]])
    adjustments = data["adjustments"]
    out += _table(
        f"Adjustments (credits {cents_text(adjustments['credits'])}, charges {cents_text(adjustments['charges'])})",
        ("account", "period", "kind", "amount", "reason"),
        [(a["account"], a["period"], a["kind"], cents_text(a["amount"]), a["reason"]) for a in adjustments["lines"]],
    )
    out += _table(
        "Utilization by node (allocated / available GPU-hours)",
        ("node", "state", "gpus", "allocated", "available", "down", "utilization"),
        [(r["node"], r["state"], r["gpus"], gpu_hours(r["allocated_gpu_seconds"]), gpu_hours(r["available_gpu_seconds"]), gpu_hours(r["down_gpu_seconds"]), _percent(r["utilization"])) for r in data["utilization_by_node"]],
    )
    out += _table(
        "Utilization by GPU type",
        ("gpu_type", "gpus", "allocated", "available", "down", "utilization"),
        [(r["gpu_type"], r["gpus"], gpu_hours(r["allocated_gpu_seconds"]), gpu_hours(r["available_gpu_seconds"]), gpu_hours(r["down_gpu_seconds"]), _percent(r["utilization"])) for r in data["utilization_by_gpu_type"]],
    )
    wait = data["queue_wait"]
    out += _table(
        "Queue wait (start - submit, seconds)",
        ("by", "name", "jobs", "p50", "p95", "max"),
        [("all", "", wait["all"]["jobs"], wait["all"]["p50_s"], wait["all"]["p95_s"], wait["all"]["max_s"])]
        + [("gpu_type", r["gpu_type"], r["jobs"], r["p50_s"], r["p95_s"], r["max_s"]) for r in wait["by_gpu_type"]]
        + [("account", r["account"], r["jobs"], r["p50_s"], r["p95_s"], r["max_s"]) for r in wait["by_account"]],
    )
    out += _table(
        "Waiting now",
        ("job", "account", "gpus", "gpu_type", "waiting_s", "reason"),
        [(j["slurm_job_id"], j["account"], j["gpus"], j["gpu_type"], j["waiting_s"], j["reason"]) for j in data["waiting_now"]],
    )
    payback = data["payback"]
    out += _table(
        f"Payback (electricity {payback['electricity_price_per_kwh']} per kWh; margin = revenue - electricity)",
        ("node", "cost_to_date", "revenue_to_date", "margin_to_date", "window_margin", "per_month", "months_to_payback"),
        [
            (p["node"], cents_text(p["cost_to_date"]), cents_text(p["revenue_to_date"]), cents_text(p["margin_to_date"]), cents_text(p["margin"]), cents_text(p["monthly_margin"]), p["months_to_payback"] or "never at this rate")
            for p in [*payback["nodes"], {"node": "total", **payback["total"]}]
        ] if payback["nodes"] else [],
    )
    out += [f"note: {note}" for note in data["notes"]]
    return "\n".join(out) + "\n"


def report_csv(report: Report) -> str:
    """One RFC 4180 table: section, key, metric, value. Amounts stay exact; text cells never run as formulas."""
    data = report.as_json()
    rows: list[tuple[str, str, str, Any]] = [
        ("window", "since", "time", data["since"]),
        ("window", "until", "time", data["until"]),
        ("window", "measured_until", "time", data["measured_until"]),
        ("window", "currency", "text", data["currency"]),
        *(("revenue", "total", key, value) for key, value in data["revenue"].items()),
        ("gpu_hours_sold", "total", "gpu_hours", data["gpu_hours_sold"]),
    ]
    for section, key in (
        ("revenue_by_account", "account"), ("revenue_by_gpu_type", "gpu_type"), ("revenue_by_tier", "tier"), ("revenue_by_day", "date"),
    ):
        for line in data[section]:
            rows += [(section, line[key], "gpu_seconds", line["gpu_seconds"]), (section, line[key], "amount", line["amount"])]
    for key in ("credits", "charges", "total"):
        rows.append(("adjustments", "total", key, data["adjustments"][key]))
    for index, line in enumerate(data["adjustments"]["lines"]):
        rows += [("adjustment", f"{index + 1}", name, line[name]) for name in ("account", "period", "kind", "reason", "amount", "created_at")]
    for section, key in (("utilization_by_node", "node"), ("utilization_by_gpu_type", "gpu_type")):
        for line in data[section]:
            rows += [(section, line[key], name, line[name]) for name in ("gpus", "allocated_gpu_seconds", "available_gpu_seconds", "down_gpu_seconds", "utilization")]
    wait = data["queue_wait"]
    scopes = [("all", wait["all"])]
    scopes += [(f"gpu_type:{line['gpu_type']}", line) for line in wait["by_gpu_type"]]
    scopes += [(f"account:{line['account']}", line) for line in wait["by_account"]]
    for scope, line in scopes:
        rows += [("queue_wait", scope, metric, line[metric]) for metric in ("jobs", "p50_s", "p95_s", "max_s")]
    for job in data["waiting_now"]:
        rows += [("waiting_now", job["slurm_job_id"], name, job[name]) for name in ("account", "gpus", "gpu_type", "reason", "waiting_s")]
    for line in [*data["payback"]["nodes"], {"node": "total", **data["payback"]["total"]}] if data["payback"]["nodes"] else []:
        rows += [("payback", line["node"], name, value) for name, value in line.items() if name != "node"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(("section", "key", "metric", "value"))
    for section, key, metric, value in rows:
        cell = "" if value is None else value
        writer.writerow((section, spreadsheet_text(str(key)), metric, spreadsheet_text(cell) if isinstance(cell, str) and metric in ("reason", "text", "account") else cell))
    return buffer.getvalue()
