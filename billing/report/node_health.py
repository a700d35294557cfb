"""The report's node health: per node, the GPU check's drains, hours drained, runs credited and money credited.

Drains are ``node_health_events`` (billing.node_health: each drain whose reason
starts ``gpu: ``, as a billing pass first saw it, and when one saw the node back).
Credits are the ``gpu_failure_credit`` adjustments made in the window; each names
its node in its reason, which billing.credits writes (``... (node gpu1))``), each
rounded to the cent as its invoice line is.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.credits import GPU_FAILURE, KINDS
from billing.money import format_cents, round_to_cents
from gpupool.models import Adjustment, NodeHealthEvent

# The end of an automatic GPU-failure credit's reason: "... (gpu_failure: <finding> (node <name>))".
_NODE_IN_REASON = re.compile(r"\(node (?P<node>[^()\s]+)\)\)$")


def node_health(session: Session, since: dt.datetime, until: dt.datetime, end: dt.datetime) -> list[dict[str, Any]]:
    """Per node with a drain or a credit in the window: drains begun in it, hours drained within it, its credits."""
    lines: dict[str, dict[str, Any]] = {}

    def line(node: str) -> dict[str, Any]:
        return lines.setdefault(node, {"node": node, "drains": 0, "drained_s": 0, "runs_credited": 0, "credited_cents": 0})

    drains = session.scalars(
        select(NodeHealthEvent).where(
            NodeHealthEvent.drained_at < end,
            NodeHealthEvent.resumed_at.is_(None) | (NodeHealthEvent.resumed_at > since),
        )
    )
    for drain in drains:
        figures = line(drain.node)
        if since <= drain.drained_at < until:
            figures["drains"] += 1
        inside = min(drain.resumed_at or end, end) - max(drain.drained_at, since)
        figures["drained_s"] += max(int(inside.total_seconds()), 0)
    credits = session.execute(
        select(Adjustment.reason, Adjustment.amount_nanos).where(
            Adjustment.kind == KINDS[GPU_FAILURE], Adjustment.created_at >= since, Adjustment.created_at < until,
        )
    )
    for reason, nanos in credits:
        found = _NODE_IN_REASON.search(reason)
        figures = line(found["node"] if found else "(unknown)")
        figures["runs_credited"] += 1
        figures["credited_cents"] -= round_to_cents(nanos)
    return [
        {
            "node": node, "drains": figures["drains"], "hours_drained": f"{figures['drained_s'] / 3600:.2f}",
            "runs_credited": figures["runs_credited"], "credited": format_cents(figures["credited_cents"]),
        }
        for node, figures in sorted(lines.items())
    ]
