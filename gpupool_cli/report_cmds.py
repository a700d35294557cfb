"""``gpupool report`` and ``gpupool node cost``: the operator's view of earnings, use and payback."""

from __future__ import annotations

import argparse
import json
import sys

from sqlalchemy import select

from billing.money import MoneyError, format_nanos, parse_nanos
from billing.report import build_report, parse_window, report_csv, report_table
from gpupool import db
from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.models import NodeCost
from gpupool.slurm.client import SlurmClient
from gpupool_cli.billing_cmds import parse_utc, period_argument


def _price(value: str) -> int:
    try:
        nanos = parse_nanos(value, what="price")
    except MoneyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if nanos < 0:
        raise argparse.ArgumentTypeError("a purchase price cannot be negative")
    return nanos


def cmd_report(settings: Settings, args: argparse.Namespace) -> int:
    if args.period and (args.since or args.until):
        print("gpupool: error: give --period or --since/--until, not both", file=sys.stderr)
        return 2
    now = settings.calendar_clock()().replace(microsecond=0)
    since, until = parse_window(args.period, args.since, args.until, now=now)
    sessions = db.migrated_sessions(settings.database_url)
    with sessions() as session:
        report = build_report(session, SlurmClient(settings), settings, since, until, now)
    if args.format == "json":
        print(json.dumps(report.model_dump(mode="json"), indent=2))
    elif args.format == "csv":
        sys.stdout.write(report_csv(report))
    else:
        sys.stdout.write(report_table(report))
    return 0


def _watts(value: str) -> int:
    if not value.isdigit() or not 0 < int(value) <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{value!r} is not a power draw in whole watts, such as 1800")
    return int(value)


def _node_name(value: str) -> str:
    if not value or len(value) > 64 or any(char in value for char in " ,[]|\t\n"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Slurm node name such as gpu01")
    return value


def cmd_node_cost_set(settings: Settings, args: argparse.Namespace) -> int:
    sessions = db.migrated_sessions(settings.database_url)
    with sessions() as session, session.begin():
        cost = session.get(NodeCost, args.node) or NodeCost(node=args.node)
        cost.purchase_price_nanos = args.price
        cost.in_service_since = args.since
        cost.watts = args.watts
        cost.updated_at = db.utcnow()
        session.add(cost)
    print(
        f"node {args.node}: {format_nanos(args.price)} {settings.currency}, in service since "
        f"{utc_text(args.since)}, {args.watts} W at {settings.electricity_price_per_kwh} {settings.currency}/kWh"
    )
    return 0


def cmd_node_cost_list(settings: Settings, _args: argparse.Namespace) -> int:
    sessions = db.migrated_sessions(settings.database_url)
    with sessions() as session:
        for cost in session.scalars(select(NodeCost).order_by(NodeCost.node)):
            print(f"{cost.node}\t{format_nanos(cost.purchase_price_nanos)}\t{utc_text(cost.in_service_since)}\t{cost.watts}")
    return 0


def add_report_parsers(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Adds ``report`` and ``node cost``; returns ``node``'s subcommands, which gpupool_cli.node_cmds adds to."""
    report = sub.add_parser("report", help="revenue, utilization, queue wait and payback for a month or a range")
    report.add_argument("--period", type=period_argument, help="UTC month YYYY-MM (default: this month)")
    report.add_argument("--since", type=parse_utc, help="range start (ISO 8601, UTC unless given)")
    report.add_argument("--until", type=parse_utc, help="range end (default: now)")
    report.add_argument("--format", choices=("table", "csv", "json"), default="table")
    report.set_defaults(handler=cmd_report)

    node = sub.add_parser("node", help="nodes: their cost for the report's payback; drain and resume").add_subparsers(
        dest="node_command", required=True
    )
    cost = node.add_parser("cost", help="hardware cost per node").add_subparsers(dest="cost_command", required=True)
    cost_set = cost.add_parser("set", help="a node's purchase price, in-service date and power draw")
    cost_set.add_argument("node", type=_node_name, help="the node as sinfo names it")
    cost_set.add_argument("--price", required=True, type=_price, help="purchase price in the billing currency, e.g. 2400")
    cost_set.add_argument("--since", required=True, type=parse_utc, help="in service since (ISO 8601 date)")
    cost_set.add_argument("--watts", required=True, type=_watts, help="average power draw of the whole node, in watts")
    cost_set.set_defaults(handler=cmd_node_cost_set)
    cost.add_parser("list", help="every node's cost").set_defaults(handler=cmd_node_cost_list)
    return node
