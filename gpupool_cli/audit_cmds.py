"""``gpupool audit list``: the audit log, newest first, as tab-separated lines or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpupool import audit, db
from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.models import AuditEvent
from gpupool_cli.billing_cmds import parse_utc


def _as_dict(row: AuditEvent) -> dict[str, Any]:
    return {
        "id": row.id, "at": utc_text(row.at), "account": row.account, "actor": row.actor, "via": row.via,
        "credential": row.credential, "address": row.address, "action": row.action, "target": row.target,
        "details": row.details,
    }


def cmd_audit_list(settings: Settings, args: argparse.Namespace) -> int:
    with db.migrated_sessions(settings.database_url)() as session:
        rows = audit.events(session, account=args.account, since=args.since, limit=args.limit)
        shown = [_as_dict(row) for row in rows]
    if args.json:
        print(json.dumps(shown, indent=2))
        return 0
    for event in shown:
        # JSON for the free-form parts: a subject or target can hold a tab, and stays one field.
        details = "" if event["details"] is None else json.dumps(event["details"], sort_keys=True)
        print("\t".join(
            str(part) if part is not None else "-"
            for part in (event["at"], event["account"], json.dumps(event["actor"]), event["via"], event["credential"],
                         event["address"], event["action"], json.dumps(event["target"]), details)
        ))
    return 0


def add_audit_parsers(sub: Any) -> None:
    audit_parser = sub.add_parser("audit", help="who changed keys, members, limits, prices and tokens").add_subparsers(
        dest="audit_command", required=True
    )
    listing = audit_parser.add_parser("list", help="the audit log, newest first")
    listing.add_argument("--account", help="one account's events only")
    listing.add_argument("--since", type=parse_utc, help="from this time on (ISO 8601, UTC unless given)")
    listing.add_argument("--limit", type=int, default=100, help=f"at most this many (up to {audit.MAX_PAGE})")
    listing.add_argument("--json", action="store_true", help="a JSON list instead of tab-separated lines")
    listing.set_defaults(handler=cmd_audit_list)
