"""Payback: node costs and electricity against the revenue of the runs each node ran."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from billing.money import format_nanos
from billing.report.intervals import divide_half_up, overlap_s
from billing.report.revenue import RunId
from billing.report.utilization import gpus_on_nodes
from gpupool.clock import utc_text
from gpupool.slurm.report import Allocation

# An average Gregorian month (365.2425 days / 12): "per month" rates use it.
AVERAGE_MONTH_S = 2_629_746
# Watt-seconds in a kilowatt-hour.
_WS_PER_KWH = 3_600_000


def energy_nanos(watts: int, seconds: int, price_per_kwh_nanos: int) -> int:
    """Electricity cost of ``watts`` for ``seconds``, to the nano-unit."""
    return divide_half_up(watts * seconds * price_per_kwh_nanos, _WS_PER_KWH)


def months_to_payback(still_owed_nanos: int, monthly_margin_nanos: int) -> str | None:
    """Months until the margin covers what is still owed: "0.0" once paid back, None at no margin."""
    if still_owed_nanos <= 0:
        return "0.0"
    if monthly_margin_nanos <= 0:
        return None
    return str((Decimal(still_owed_nanos) / Decimal(monthly_margin_nanos)).quantize(Decimal("0.1"), ROUND_HALF_UP))


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
        monthly_margin = divide_half_up(margin * AVERAGE_MONTH_S, window_s) if window_s else 0
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
        lines.append({"node": cost.node, "in_service_since": utc_text(cost.in_service_since), "watts": cost.watts, **_payback_json(figures)})
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
