"""The webhook sender as a long-running command: ``gpupool webhooks run`` and ``python -m gpupool.webhooks`` alike."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from gpupool import db
from gpupool.config import Settings, load_settings
from gpupool.errors import GpupoolError
from gpupool.webhooks.sender import WebhookSender


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--once", action="store_true", help="attempt what is due now, then exit")
    parser.add_argument("--idle-s", type=float, default=1.0, help="pause when nothing is due")


def run_sender(settings: Settings, args: argparse.Namespace) -> int:
    """Deliver until SIGTERM or SIGINT (or, with ``--once``, what is due now), finishing the attempts in hand."""
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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpupool.webhooks``: settings from the environment and GPUPOOL_CONFIG, as the CLI reads them."""
    parser = argparse.ArgumentParser(prog="python -m gpupool.webhooks", description="The gpupool webhook sender (one per cluster).")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_sender(load_settings(), args)
    except GpupoolError as exc:
        print(f"gpupool: error: {exc.message}", file=sys.stderr)
        return 1
