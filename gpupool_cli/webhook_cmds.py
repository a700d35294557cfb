"""``gpupool webhooks run``: the one sender per cluster that delivers webhook events; ``gpupool email send-due``."""

from __future__ import annotations

import argparse
import logging
import signal
from types import FrameType
from typing import Any

from gpupool import db
from gpupool.config import Settings
from gpupool.email_outbox import send_due
from gpupool.webhooks import WebhookSender


def cmd_webhooks_run(settings: Settings, args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs each request's URL at INFO, and a receiver's path or query may be its own secret
    # (Slack's are): the sender's own lines name the endpoint by its id instead.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    engine = db.migrated_engine(settings.database_url)
    sender = WebhookSender(db.make_session_factory(engine), settings)
    try:
        if args.once:
            attempted = sender.run_once()
            print(f"{attempted} deliveries attempted")
            return 0
        stopping = False

        def stop(_signum: int, _frame: FrameType | None) -> None:
            nonlocal stopping
            stopping = True  # finish the delivery in hand, then exit

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        sender.run(stop=lambda: stopping, idle_s=args.idle_s)
        return 0
    finally:
        sender.close()
        engine.dispose()


def add_webhook_parsers(sub: Any) -> None:
    webhooks = sub.add_parser("webhooks", help="webhook deliveries").add_subparsers(dest="webhooks_command", required=True)
    run = webhooks.add_parser("run", help="deliver due events until stopped (run exactly one per cluster)")
    run.add_argument("--once", action="store_true", help="attempt what is due now, then exit")
    run.add_argument("--idle-s", type=float, default=1.0, help="pause when nothing is due")
    run.set_defaults(handler=cmd_webhooks_run)


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
