"""Which host leads what: the pure readers behind ``gpupool status`` (gpupool_cli.status_cmds).

- ``parse_scontrol_ping``: Slurm's controllers, primary and backups, up or down;
- ``parse_patroni_cluster``: Patroni's ``GET /cluster``, the database members with role, state and lag.

Each reads one program's own text, recorded in tests/unit/fixtures/status/.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# scontrol ping (Slurm 22.05's src/scontrol/info_misc.c, _ping_slurmctld): one line per SlurmctldHost,
# in slurm.conf's order: "Slurmctld(primary) at mn-ctl is UP", then "Slurmctld(backup) at mn-ctl2 is
# DOWN" ("backup1", "backup2"... with more than one backup). Run as root with any controller down, it
# adds a banner of three lines: asterisks, "** RESTORE SLURMCTLD DAEMON TO SERVICE **", asterisks.
_PING_LINE = re.compile(r"^Slurmctld\((?P<role>primary|backup\d*)\) at (?P<host>\S+) is (?P<state>UP|DOWN)$")
_PING_BANNER = re.compile(r"^(\*+|\*\* RESTORE SLURMCTLD DAEMON TO SERVICE \*\*)$")


class StatusParseError(ValueError):
    """Text that is not what the program prints: said, never guessed at."""


@dataclass(frozen=True)
class Controller:
    role: str  # primary, backup, backup1...
    host: str
    up: bool


def parse_scontrol_ping(text: str) -> list[Controller]:
    """Every controller line of ``scontrol ping``; StatusParseError when none is, or a line is not one."""
    controllers = []
    for line in text.splitlines():
        if not line.strip() or _PING_BANNER.match(line.strip()):
            continue
        found = _PING_LINE.match(line.strip())
        if found is None:
            raise StatusParseError(f"not a line of scontrol ping: {line.strip()[:200]!r}")
        controllers.append(Controller(found["role"], found["host"], found["state"] == "UP"))
    if not controllers:
        raise StatusParseError("scontrol ping printed no controller")
    return controllers


@dataclass(frozen=True)
class DatabaseMember:
    """One member of Patroni's cluster, as ``GET /cluster`` describes it."""

    name: str
    role: str  # leader, standby_leader, sync_standby, quorum_standby, replica
    state: str  # running, streaming, stopped, starting...
    host: str
    port: int | None
    # Bytes of WAL behind the leader; None for the leader, or where Patroni says "unknown".
    lag_bytes: int | None

    @property
    def leads(self) -> bool:
        return self.role in ("leader", "standby_leader")


def parse_patroni_cluster(body: bytes | str) -> list[DatabaseMember]:
    """Patroni's ``/cluster`` answer (3.0 and later): ``{"members": [{"name", "role", "state", "host", "port", "lag", ...}]}``.

    ``lag`` is absent on the leader and an integer (bytes) or ``"unknown"`` on the others;
    ``host``/``port`` are absent on a member that registered none.
    """
    try:
        document: Any = json.loads(body)
    except ValueError as exc:
        raise StatusParseError(f"Patroni's /cluster is not JSON: {exc}") from exc
    members = document.get("members") if isinstance(document, dict) else None
    if not isinstance(members, list):
        raise StatusParseError("Patroni's /cluster has no members list")
    parsed = []
    for member in members:
        if not isinstance(member, dict) or not isinstance(member.get("name"), str) or not isinstance(member.get("role"), str):
            raise StatusParseError(f"a member of Patroni's /cluster without name or role: {str(member)[:200]}")
        lag = member.get("lag")
        port = member.get("port")
        parsed.append(
            DatabaseMember(
                name=member["name"], role=member["role"], state=str(member.get("state", "")), host=str(member.get("host", "")),
                port=port if isinstance(port, int) else None,
                lag_bytes=lag if isinstance(lag, int) and not isinstance(lag, bool) else None,
            )
        )
    return parsed
