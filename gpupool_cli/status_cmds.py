"""``gpupool status``: which host leads the database and which slurmctld answers, and whether Redis does.

- The database: the server ``database_url`` reaches (with libpq's host list and
  ``target_session_attrs=read-write``, the leader), its address and whether it takes
  writes; with ``patroni_urls``, every member from Patroni's ``/cluster``, the first URL
  that answers, with role, state and lag.
- Slurm: each controller of slurm.conf, primary and backups, from ``scontrol ping``.
- The rate-limit store: answering, or gone (the API then limits per worker, api.__init__).

Exit 1 when no database that takes writes or no controller answers: a monitor can run it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from gpupool import db
from gpupool.cluster_status import Controller, DatabaseMember, StatusParseError, parse_patroni_cluster
from gpupool.config import Settings
from gpupool.errors import SlurmUnavailable
from gpupool.http import FetchFailed, fetch
from gpupool.ratelimit_store import store_state
from gpupool.slurm.client import SlurmClient

ASK_TIMEOUT_S = 3.0
PATRONI_MAX_BYTES = 1 << 20


@dataclass
class DatabaseState:
    backend: str  # postgresql, sqlite
    address: str | None = None  # the server's own (inet_server_addr); None over a Unix socket or when unreached
    port: int | None = None
    writable: bool = False
    error: str | None = None


@dataclass
class PatroniState:
    url: str | None = None  # the one that answered
    members: list[DatabaseMember] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class ClusterStatus:
    database: DatabaseState
    patroni: PatroniState | None
    controllers: list[Controller]
    slurm_error: str | None
    ratelimit_store: str

    @property
    def healthy(self) -> bool:
        return self.database.writable and any(controller.up for controller in self.controllers)


def database_state(url: str) -> DatabaseState:
    """The server ``url`` reaches, asked who it is: ``inet_server_addr()``, and whether it is a standby or read-only."""
    engine = db.make_engine(url) if url.startswith("sqlite") else db.make_engine(url, connect_args={"connect_timeout": int(ASK_TIMEOUT_S)})
    backend = engine.dialect.name
    try:
        with engine.connect() as connection:
            if backend != "postgresql":
                connection.execute(text("SELECT 1"))
                return DatabaseState(backend, writable=True)
            row = connection.execute(
                text("SELECT host(inet_server_addr()), inet_server_port(), pg_is_in_recovery(), current_setting('transaction_read_only')")
            ).one()
        return DatabaseState(backend, address=row[0], port=row[1], writable=not row[2] and row[3] != "on")
    except DBAPIError as exc:
        # The driver's first line says why (refused, timeout, authentication); never the URL, which may hold a password.
        return DatabaseState(backend, error=str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__)
    finally:
        engine.dispose()


def patroni_state(urls: tuple[str, ...]) -> PatroniState:
    """The members as the first of ``urls`` that answers describes them (each Patroni serves the whole cluster)."""
    state = PatroniState()
    for url in urls:
        cluster_url = url.rstrip("/") + "/cluster"
        try:
            answer = fetch(cluster_url, timeout_s=ASK_TIMEOUT_S, max_bytes=PATRONI_MAX_BYTES)
            if answer.status != 200:
                raise FetchFailed(f"{cluster_url}: HTTP {answer.status}")
            state.members = parse_patroni_cluster(answer.body)
        except (FetchFailed, StatusParseError) as exc:
            state.errors.append(str(exc))
            continue
        state.url = cluster_url
        return state
    return state


def gather(settings: Settings, slurm: SlurmClient) -> ClusterStatus:
    controllers: list[Controller] = []
    slurm_error = None
    try:
        controllers = slurm.controllers()
    except SlurmUnavailable as exc:
        slurm_error = exc.message
    return ClusterStatus(
        database=database_state(settings.database_url),
        patroni=patroni_state(settings.patroni_urls) if settings.patroni_urls else None,
        controllers=controllers,
        slurm_error=slurm_error,
        ratelimit_store=store_state(settings),
    )


def _lag(member: DatabaseMember) -> str:
    if member.leads:
        return "-"
    return "unknown" if member.lag_bytes is None else f"{member.lag_bytes} B"


_STORE_WORDS = {
    "memory": "memory (this process's own counts: one API host)",
    "ok": "answering",
    "down": "NOT ANSWERING: each API worker limits on its own until it answers again",
}


def render_text(status: ClusterStatus) -> str:
    lines = []
    found = status.database
    if found.error is not None:
        lines.append(f"database: NOT ANSWERING ({found.error})")
    elif found.backend != "postgresql":
        lines.append(f"database: {found.backend} on this host (takes writes)")
    else:
        where = "a Unix socket" if found.address is None else f"{found.address}:{found.port}"
        lines.append(f"database: {where} ({'leader, takes writes' if found.writable else 'READ-ONLY: a standby, or a failover under way'})")
    if status.patroni is not None:
        if status.patroni.url is None:
            lines.append("  patroni: no member answered: " + "; ".join(status.patroni.errors))
        else:
            lines.append(f"  patroni ({status.patroni.url}):")
            if not any(member.leads for member in status.patroni.members):
                lines.append("    NO LEADER")
            rows = [
                (m.name, m.role, m.state, f"{m.host}:{m.port}" if m.port else m.host or "-", _lag(m))
                for m in status.patroni.members
            ]
            widths = [max(len(row[i]) for row in rows) for i in range(4)] if rows else []
            for row in rows:
                lines.append("    " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + f"  lag {row[4]}")
    lines.append("slurm controllers:" + (f" NOT READ ({status.slurm_error})" if status.slurm_error else ""))
    width = max((len(c.role) for c in status.controllers), default=0)
    host_width = max((len(c.host) for c in status.controllers), default=0)
    for controller in status.controllers:
        lines.append(f"  {controller.role.ljust(width)}  {controller.host.ljust(host_width)}  {'UP' if controller.up else 'DOWN'}")
    lines.append(f"rate-limit store: {_STORE_WORDS[status.ratelimit_store]}")
    return "\n".join(lines)


def render_json(status: ClusterStatus) -> dict[str, Any]:
    patroni = None
    if status.patroni is not None:
        patroni = {
            "url": status.patroni.url,
            "members": [asdict(member) | {"leads": member.leads} for member in status.patroni.members],
            "errors": status.patroni.errors,
        }
    return {
        "healthy": status.healthy,
        "database": asdict(status.database),
        "patroni": patroni,
        "slurm": {"controllers": [asdict(controller) for controller in status.controllers], "error": status.slurm_error},
        "ratelimit_store": status.ratelimit_store,
    }


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    status = gather(settings, SlurmClient(settings))
    print(json.dumps(render_json(status), indent=2) if args.json else render_text(status))
    return 0 if status.healthy else 1


def add_status_parser(sub: Any) -> None:
    status = sub.add_parser(
        "status", help="which host leads the database and Slurm, and whether Redis answers (exit 1: no database leader or no controller)"
    )
    status.add_argument("--json", action="store_true", help="the same as one JSON document")
    status.set_defaults(handler=cmd_status)
