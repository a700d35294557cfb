"""``gpupool webhooks run``: the one sender per cluster that delivers webhook events; ``gpupool email send-due``."""

from __future__ import annotations

import argparse
from typing import Any

from gpupool import db
from gpupool.config import Settings
from gpupool.email_outbox import send_due
from gpupool.webhooks.run import add_run_arguments, run_sender


def add_webhook_parsers(sub: Any) -> None:
    webhooks = sub.add_parser("webhooks", help="webhook deliveries").add_subparsers(dest="webhooks_command", required=True)
    run = webhooks.add_parser("run", help="deliver due events until stopped (run exactly one per cluster)")
    add_run_arguments(run)
    run.set_defaults(handler=run_sender)


def cmd_email_send_due(settings: Settings, args: argparse.Namespace) -> int:
    engine = db.migrated_engine(settings.database_url)
    try:
        sent, failed = send_due(db.make_session_factory(engine), settings)
    finally:
        engine.dispose()
    print(f"{sent} emails sent, {failed} failed (retried later)" if settings.smtp_host else "no smtp_host set: no email sent")
    return 0


def add_email_parsers(sub: Any) -> None:
    email = sub.add_parser("email", help="spend-alert email").add_subparsers(dest="email_command", required=True)
    send = email.add_parser("send-due", help="send the outbox's due emails through smtp_host (cron: every minute)")
    send.set_defaults(handler=cmd_email_send_due)
