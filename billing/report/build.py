"""The report of one window: every figure, gathered from the ledger, sacct, sacctmgr, sinfo and squeue."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.invoice import gib_hours_text
from billing.money import format_cents, format_nanos, parse_nanos
from billing.report.alerts import alerts_sent
from billing.report.idle import idle_figures, idle_rows
from billing.report.intervals import gpu_hours
from billing.report.node_health import node_health
from billing.report.payback import NodePayback, attribute_to_nodes, payback_figures
from billing.report.queue_wait import queue_waits, waiting_now_lines
from billing.report.revenue import ledger_window, lifetime_revenue_by_run, storage_window, window_adjustments
from billing.report.schema import ReportOut
from billing.report.utilization import utilization_cells, utilization_line
from gpupool.config import Settings
from gpupool.models import NodeCost
from gpupool.slurm.client import SlurmClient


def build_report(
    session: Session, slurm: SlurmClient, settings: Settings, since: dt.datetime, until: dt.datetime, now: dt.datetime
) -> ReportOut:
    """Every figure of [since, until), measured up to ``now``; reads the ledger, sacct, sacctmgr, sinfo and squeue.

    Validated as it is made: a figure the model does not describe, or one it requires and
    the report lacks, fails here rather than in a client. ``model_dump(mode="json")`` is what
    ``GET /admin/report`` answers.
    """
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
    storage = storage_window(session, since, end)
    storage_cents = sum(sums.cents for sums in storage.values())
    alerts = alerts_sent(session, since, until)
    idle = idle_figures(idle_rows(session, since, until), ledger.total.gpu_seconds)
    adjustment_cents = adjustments.pop("_cents")

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
    return ReportOut.model_validate({
        "since": since,
        "until": until,
        "measured_until": end,
        "generated_at": now,
        "currency": settings.currency,
        "revenue": {
            "gpu_seconds": ledger.total.gpu_seconds,
            "amount": format_cents(ledger.total.cents),
            "storage": format_cents(storage_cents),
            "adjustments": format_cents(adjustment_cents),
            "net": format_cents(ledger.total.cents + storage_cents + adjustment_cents),
        },
        "revenue_by_account": [{"account": name, **sums.as_invoiced_json()} for name, sums in sorted(ledger.by_account.items())],
        "revenue_by_gpu_type": [{"gpu_type": name, **sums.as_invoiced_json()} for name, sums in sorted(ledger.by_gpu_type.items())],
        "revenue_by_tier": [{"tier": name, **sums.as_invoiced_json()} for name, sums in sorted(ledger.by_tier.items())],
        "revenue_by_day": [
            {
                "date": day.isoformat(),
                **sums.as_json(),
                "gpu_seconds_by_gpu_type": {t: s for (d, t), s in sorted(ledger.by_day_and_type.items()) if d == day},
            }
            for day, sums in sorted(ledger.by_day.items())
        ],
        "storage_by_account": [
            {"account": name, "gib_hours": gib_hours_text(sums.byte_seconds), "amount": format_cents(sums.cents)}
            for name, sums in sorted(storage.items())
        ],
        "adjustments": adjustments,
        "alerts_sent": alerts,
        "idle_gpus": idle,
        "gpu_seconds_sold": ledger.total.gpu_seconds,
        "gpu_hours_sold": gpu_hours(ledger.total.gpu_seconds),
        "utilization": utilization_line("scope", "cluster", cells.values()),
        "utilization_by_node": by_node,
        "utilization_by_gpu_type": by_type,
        "queue_wait": queue_waits(allocations, node_types, since, end),
        "waiting_now": waiting_now_lines(pending, now),
        "payback": payback,
        "node_health": node_health(session, since, until, end),
        "notes": notes,
    })
