"""``gpupool node drain|resume``: take a node out of service and bring it back, audited.

The GPU health check (gpupool-gpu-check) drains a node whose GPU fails and never
resumes it: the operator does, here, once satisfied the GPU is sound (or has been
replaced). Both go through scontrol (the operator must be a Slurm administrator:
root, or an AdminLevel user) and write an audit row, ``node.drain`` or
``node.resume`` with the node as target, in the same transaction.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from gpupool import audit, db
from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient

# One Slurm node name, never a host list: each node's drain or resume is its own audited act.
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_REASON_CHARS = 200


def _node_name(value: str) -> str:
    if not _NODE_NAME.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not one Slurm node name (letters, digits, . _ -)")
    return value


def _reason(value: str) -> str:
    text = value.strip()
    if not text or len(text) > MAX_REASON_CHARS or any(ch in text for ch in "\r\n\t"):
        raise argparse.ArgumentTypeError(f"give a reason of one line, 1 to {MAX_REASON_CHARS} characters")
    return text


def make_slurm(settings: Settings) -> SlurmClient:
    """The Slurm client the commands use (tests put a recorded runner behind it)."""
    return SlurmClient(settings)


def cmd_node_drain(settings: Settings, args: argparse.Namespace) -> int:
    slurm = make_slurm(settings)
    before = slurm.node_status(args.node)
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        slurm.drain_node(args.node, args.reason)
        audit.record(
            session, audit.operator_actor(), audit.NODE_DRAIN, account=None, target=args.node, now=db.utcnow(),
            details={"reason": args.reason, "state_before": before.state, "reason_before": before.reason},
        )
    print(f"node {args.node} drained: {args.reason} (running jobs finish; `gpupool node resume {args.node}` brings it back)")
    return 0


def cmd_node_resume(settings: Settings, args: argparse.Namespace) -> int:
    slurm = make_slurm(settings)
    before = slurm.node_status(args.node)
    if not before.out_of_service:
        print(f"node {args.node} is in service (State={before.state}): nothing to resume")
        return 0
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        slurm.resume_node(args.node)
        audit.record(
            session, audit.operator_actor(), audit.NODE_RESUME, account=None, target=args.node, now=db.utcnow(),
            details={"state_before": before.state, "reason_before": before.reason},
        )
    was = f" (was {before.state}: {before.reason})" if before.reason else f" (was {before.state})"
    print(f"node {args.node} resumed{was}")
    return 0


def add_node_parsers(node: Any) -> None:
    """``drain`` and ``resume`` beside ``node cost`` (gpupool_cli.report_cmds makes ``node``)."""
    drain = node.add_parser("drain", help="no new jobs on the node; running jobs finish")
    drain.add_argument("node", type=_node_name)
    drain.add_argument("--reason", type=_reason, required=True, help="what Slurm shows as the node's reason")
    drain.set_defaults(handler=cmd_node_drain)
    resume = node.add_parser("resume", help="a drained or down node back in service (the GPU check never does this)")
    resume.add_argument("node", type=_node_name)
    resume.set_defaults(handler=cmd_node_resume)
