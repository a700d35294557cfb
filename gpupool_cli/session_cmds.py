"""``gpupool sessions sweep`` (the idle stop) and ``gpupool proxy nginx-config`` (the sessions' nginx)."""

from __future__ import annotations

import argparse
import logging
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

from gpupool import db
from gpupool.config import Settings
from gpupool.db.locks import SESSIONS_SWEEP, alone
from gpupool.errors import ConfigError, GpupoolError
from gpupool.jobstate import JobStateRefresher
from gpupool.proxy import ProxyConfig, render_sessions_conf, standalone_nginx_conf
from gpupool.sessions import sweep_idle
from gpupool.slurm.client import SlurmClient
from gpupool.webhooks.outbox import output_counter


def _sweep_once(settings: Settings, refresher: JobStateRefresher, sessions: Any, slurm: SlurmClient) -> list[str] | None:
    """One sweep, or None while another host's (or process's) sweep holds the lock: once per cluster."""
    with sessions() as lock_session, alone(lock_session, SESSIONS_SWEEP) as first:
        if not first:
            logging.getLogger("gpupool.sessions").info("another sweep holds the lock: this one does nothing")
            return None
        # States first: the sweep looks at running sessions only, as Slurm last said.
        try:
            refresher.refresh()
        except GpupoolError as exc:
            logging.getLogger("gpupool.sessions").warning("job states not refreshed: %s", exc.message)
        with sessions() as session:
            return sweep_idle(session, settings, slurm, db.utcnow())


def cmd_sessions_sweep(settings: Settings, args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = db.migrated_engine(settings.database_url)
    sessions = db.make_session_factory(engine)
    slurm = SlurmClient(settings)
    refresher = JobStateRefresher(
        sessions, slurm, interval_s=settings.refresh_interval_s,
        submission_grace_s=settings.slurm_submit_timeout_s * 4 + 30, unknown_after_s=settings.unknown_after_s,
        count_outputs=output_counter(settings),
    )
    try:
        if args.every_s is None:
            stopped = _sweep_once(settings, refresher, sessions, slurm)
            if stopped is None:
                print("another sweep holds the lock (this host or another): this one did nothing")
                return 0
            print(f"{len(stopped)} idle session(s) cancelled" + "".join(f"\n  {job_id}" for job_id in stopped))
            return 0
        stopping = False

        def stop(_signum: int, _frame: FrameType | None) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        while not stopping:
            _sweep_once(settings, refresher, sessions, slurm)
            deadline = time.monotonic() + args.every_s
            while not stopping and time.monotonic() < deadline:
                time.sleep(min(1.0, args.every_s))
        return 0
    finally:
        engine.dispose()


def cmd_proxy_config(settings: Settings, args: argparse.Namespace) -> int:
    if not settings.session_proxy_key:
        raise ConfigError("set session_proxy_key (GPUPOOL_SESSION_PROXY_KEY): nginx sends it to the API")
    scheme, _, rest = settings.sessions_url.partition("://")
    config = ProxyConfig(
        sessions_domain=rest.split(":", 1)[0], api_url=args.api_url, public_api_url=args.public_api_url or args.api_url,
        proxy_key=settings.session_proxy_key, listen=tuple(args.listen), scheme=scheme,
    )
    if args.state_dir:
        print(standalone_nginx_conf(config, Path(args.state_dir)), end="")
    else:
        print(render_sessions_conf(config), end="")
    return 0


def add_session_parsers(sub: Any) -> None:
    sessions = sub.add_parser("sessions", help="interactive sessions").add_subparsers(dest="sessions_command", required=True)
    sweep = sessions.add_parser("sweep", help="cancel, as their tenants, the sessions idle for their timeout")
    sweep.add_argument("--every-s", type=float, default=None, help="keep sweeping at this interval until stopped")
    sweep.set_defaults(handler=cmd_sessions_sweep)
    proxy = sub.add_parser("proxy", help="the sessions' reverse proxy").add_subparsers(dest="proxy_command", required=True)
    conf = proxy.add_parser("nginx-config", help="print nginx's config for the sessions (the playbook role's template)")
    conf.add_argument("--listen", action="append", required=True, help="host:port nginx listens on (repeatable)")
    conf.add_argument("--api-url", required=True, help="where nginx reaches the API, http://host:port")
    conf.add_argument("--public-api-url", default=None, help="the API's address in browsers, for the sign-in redirect")
    conf.add_argument("--state-dir", default=None, help="print a whole nginx.conf keeping pid, logs and temp files here")
    conf.set_defaults(handler=cmd_proxy_config)
