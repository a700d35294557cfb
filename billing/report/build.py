"""The report of one window: every figure, gathered from the ledger, sacct, sacctmgr, sinfo and squeue."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.money import format_nanos, parse_nanos
from billing.report.alerts import alerts_sent
from billing.report.idle import idle_figures, idle_rows
from billing.report.intervals import gpu_hours
from billing.report.payback import NodePayback, attribute_to_nodes, payback_figures
from billing.report.queue_wait import queue_waits, waiting_now_lines
from billing.report.revenue import ledger_window, lifetime_revenue_by_run, window_adjustments
from billing.report.utilization import utilization_cells, utilization_line
from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.models import NodeCost
from gpupool.slurm.client import SlurmClient


@dataclass(frozen=True)
class Report:
    """Every figure of one window; ``as_json`` is what ``GET /admin/report`` answers, in the shape of
    ``billing.report.schema.ReportOut`` (the OpenAPI schema; tests/unit/test_report_schema.py holds them together).

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
    # Spend alerts the billing passes sent in the window (billing.alerts), by account, kind and threshold.
    alerts_sent: list[dict[str, Any]] = field(default_factory=list)
    # GPU-seconds under the idle threshold (billing.report.idle): total, share of those sold, by account and template.
    idle_gpus: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "since": utc_text(self.since),
            "until": utc_text(self.until),
            "measured_until": utc_text(self.measured_until),
            "generated_at": utc_text(self.generated_at),
            "currency": self.currency,
            "revenue": self.revenue,
            "revenue_by_account": self.revenue_by_account,
            "revenue_by_gpu_type": self.revenue_by_gpu_type,
            "revenue_by_tier": self.revenue_by_tier,
            "revenue_by_day": self.revenue_by_day,
            "adjustments": self.adjustments,
            "gpu_seconds_sold": self.gpu_seconds_sold,
            "gpu_hours_sold": self.gpu_hours_sold,
            "idle_gpus": self.idle_gpus,
            "utilization": self.utilization,
            "utilization_by_node": self.utilization_by_node,
            "utilization_by_gpu_type": self.utilization_by_gpu_type,
            "queue_wait": self.queue_wait,
            "waiting_now": self.waiting_now,
            "payback": self.payback,
            "alerts_sent": [{**line, "last_sent_at": utc_text(line["last_sent_at"])} for line in self.alerts_sent],
            "notes": self.notes,
        }


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

    ledger = ledger_window(session, since, end)
    adjustments = window_adjustments(session, since, until)
    alerts = alerts_sent(session, since, until)
    idle = idle_figures(idle_rows(session, since, until), ledger.total.gpu_seconds)
    adjustment_nanos = adjustments.pop("_nanos")

    cells = utilization_cells(nodes, allocations, events, since, end)
    node_names = sorted({node for node, _type in cells})
    type_names = sorted({gpu_type for _node, gpu_type in cells})
    states = {node.name: node.state for node in nodes}
    by_node = [
        utilization_line(
            "node", name, (cell for (node, _t), cell in cells.items() if node == name),
            gpu_types={t: cell.gpus for (node, t), cell in sorted(cells.items()) if node == name and cell.gpus},
            state=states.get(name),
        )
        for name in node_names
    ]
    by_type = [utilization_line("gpu_type", name, (cell for (_n, t), cell in cells.items() if t == name)) for name in type_names]

    window_by_node, unattributed_window = attribute_to_nodes(ledger.by_run, allocations, node_types)
    revenue_to_date: dict[str, int] = {}
    lifetime = lifetime_revenue_by_run(session, history_start, end) if costs and end > history_start else {}
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
        alerts_sent=alerts,
        idle_gpus=idle,
        gpu_seconds_sold=ledger.total.gpu_seconds,
        gpu_hours_sold=gpu_hours(ledger.total.gpu_seconds),
        utilization=utilization_line("scope", "cluster", cells.values()),
        utilization_by_node=by_node,
        utilization_by_gpu_type=by_type,
        queue_wait=queue_waits(allocations, node_types, since, end),
        waiting_now=waiting_now_lines(pending, now),
        payback=payback,
        notes=notes,
    )
