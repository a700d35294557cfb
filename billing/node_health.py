"""GPU-check drains seen by the billing pass: recorded once each, the operator emailed, the node's return noted.

gpupool-gpu-check drains a node with a reason that starts ``gpu: `` and never
resumes it. Each billing pass reads every node's state and reason (``sinfo
--json``) and records a drain it has not seen (``node_health_events``, unique
per node and the time Slurm set the reason, so a later pass, or the same drain
seen again, adds nothing), with an email to ``operator_email`` in the spend
alerts' outbox (``gpupool email send-due`` sends it), and a ``node.drained``
event to ``operator_webhook_url`` in the webhooks' (``gpupool webhooks run``
sends it, signed as customers' events are). A recorded drain whose
node is back in service, or drained since for another reason, gets its
``resumed_at``: the operator report's hours drained.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.gpu_health.check import DRAIN_REASON_PREFIX
from gpupool.models import EmailOutbox, NodeHealthEvent
from gpupool.models.alerts import EMAIL_PENDING
from gpupool.slurm.report import NodeReason
from gpupool.webhooks.events import NODE_DRAINED
from gpupool.webhooks.operator import enqueue_operator_event

GPU_REASON_PREFIX = DRAIN_REASON_PREFIX


def gpu_drains(nodes: Sequence[NodeReason]) -> list[NodeReason]:
    """Nodes out of service for a reason the GPU check gave, with the time Slurm set it."""
    return [
        node for node in nodes
        if node.out_of_service and node.reason.startswith(GPU_REASON_PREFIX) and node.reason_changed_at is not None
    ]


def email_text(node: NodeReason) -> tuple[str, str]:
    subject = f"gpupool: node {node.name} drained, {node.reason}"[:255]
    body = (
        f"gpupool-gpu-check drained node {node.name} at {node.reason_changed_at:%Y-%m-%d %H:%M:%S} UTC:\n\n"
        f"    {node.reason}\n\n"
        "No new jobs start there. Jobs that held the failed GPU were ended (those that asked for requeue_on_failure,\n"
        "and spot jobs, requeued onto healthy nodes) and their runs\n"
        "are credited by the billing pass. The node stays drained until you resume it, once the GPU is sound\n"
        f"or replaced:\n\n    gpupool node resume {node.name}\n"
    )
    return subject, body


def drain_payload(node: NodeReason) -> dict[str, str]:
    """A node.drained event's ``data.node``: which node, why (Slurm's reason), since when, and how it comes back."""
    assert node.reason_changed_at is not None
    return {
        "name": node.name, "reason": node.reason, "drained_at": utc_text(node.reason_changed_at),
        "resume_with": f"gpupool node resume {node.name}",
    }


def record_drains(
    session: Session, settings: Settings, nodes: Sequence[NodeReason], now: dt.datetime, pass_id: int | None = None,
) -> int:
    """Record each new GPU drain (and email the operator), note drains that ended; in the caller's transaction. New drains."""
    drains = {(node.name, node.reason_changed_at): node for node in gpu_drains(nodes)}
    open_events = session.scalars(select(NodeHealthEvent).where(NodeHealthEvent.resumed_at.is_(None))).all()
    known = {(event.node, event.drained_at) for event in open_events}
    listed = {node.name for node in nodes}
    for event in open_events:
        # A node sinfo no longer lists is left open: it may be gone from slurm.conf, or sinfo cut short.
        if event.node in listed and (event.node, event.drained_at) not in drains:
            event.resumed_at = now
    added = 0
    for key, node in sorted(drains.items(), key=lambda item: item[0][0]):
        if key in known:
            continue
        assert node.reason_changed_at is not None  # gpu_drains keeps only those
        if session.scalar(select(NodeHealthEvent.id).where(
            NodeHealthEvent.node == node.name, NodeHealthEvent.drained_at == node.reason_changed_at,
        )) is not None:
            continue  # recorded and since closed: a clock between passes that went back, never a new drain
        session.add(NodeHealthEvent(
            node=node.name, reason=node.reason, drained_at=node.reason_changed_at, seen_at=now, billing_pass_id=pass_id,
        ))
        enqueue_operator_event(session, settings, NODE_DRAINED, now, {"node": drain_payload(node)})
        if settings.smtp_host and settings.operator_email:
            subject, body = email_text(node)
            session.add(EmailOutbox(
                account=None, recipient=settings.operator_email, subject=subject, body=body, state=EMAIL_PENDING,
                attempts=0, next_attempt_at=now, created_at=now,
            ))
        added += 1
    session.flush()  # the unique key refuses a second record here, inside the pass
    return added
