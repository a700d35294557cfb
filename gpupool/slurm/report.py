"""Slurm's answers the operator report reads: pure parsers, tested on literal strings.

``gpupool.slurm.parse`` holds the field parsers these use and maps the others.

Each keys on the header row Slurm prints (``parse_delimited``), so a column
order change in a Slurm release cannot shift a value into the wrong field.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from gpupool.slurm.parse import (
    ParseError,
    base_state,
    expand_hostlist,
    gpus_by_type,
    parse_delimited,
    parse_gres,
    parse_int,
    parse_time,
)

# sinfo --Node: one line per node and partition; %T is the long state (idle, mixed, drained, down*).
NODE_FORMAT = "%N|%G|%T"
# sacct -X: one line per allocation (and, with --duplicates, per run of a requeued job).
ALLOCATION_FIELDS = ("JobIDRaw", "JobID", "Account", "User", "State", "Submit", "Start", "End", "AllocTRES", "NodeList")
# sacctmgr show event: node events (down, drained) and cluster events (TRES registered, slurmctld down).
EVENT_FIELDS = ("Cluster", "NodeName", "TimeStart", "TimeEnd", "State", "Event")
# squeue --Format: "suffix |" separates the columns; a job asks GPUs per node or per job.
PENDING_FORMAT = "JobID:|,Account:|,UserName:|,SubmitTime:|,Reason:|,NumNodes:|,tres-per-node:|,tres-per-job:|"


@dataclass(frozen=True)
class NodeGpuCapacity:
    """A node of the cluster as sinfo shows it now: its GPUs by type, and its state."""

    name: str
    gpus: dict[str, int]
    state: str

    @property
    def gpu_count(self) -> int:
        return sum(self.gpus.values())


@dataclass(frozen=True)
class Allocation:
    """One run of one job as sacct recorded it."""

    job_id_raw: int
    job_id: str
    account: str
    user: str
    state: str
    submitted_at: dt.datetime | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    gpus: dict[str, int]
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class NodeEvent:
    """A span in which a node (or, with ``node`` empty, the whole cluster) had ``state``."""

    node: str
    start: dt.datetime
    end: dt.datetime | None  # None: still going
    state: str
    is_cluster: bool


@dataclass(frozen=True)
class PendingJob:
    slurm_job_id: str
    account: str
    user: str
    submitted_at: dt.datetime | None
    reason: str
    gpus: int
    gpu_type: str | None


@dataclass(frozen=True)
class SreportUtilization:
    """``sreport cluster utilization -T gres/gpu -t seconds``: TRES-seconds in each bucket."""

    allocated: int
    down: int
    planned_down: int
    idle: int
    planned: int
    reported: int


def parse_node_gpus(text: str) -> list[NodeGpuCapacity]:
    """Nodes from ``sinfo --Node -o %N|%G|%T``, once each though a node sits in several partitions."""
    nodes: dict[str, NodeGpuCapacity] = {}
    for row in parse_delimited(text, required=("NODELIST", "GRES", "STATE")):
        name = row["NODELIST"].strip()
        if name in nodes:
            continue
        gpus: dict[str, int] = {}
        for gres in parse_gres(row["GRES"]):
            if gres.name == "gpu":
                gpu_type = gres.gpu_type or "untyped"
                gpus[gpu_type] = gpus.get(gpu_type, 0) + gres.count
        nodes[name] = NodeGpuCapacity(name, gpus, row["STATE"].strip())
    return sorted(nodes.values(), key=lambda node: node.name)


def parse_allocations(text: str) -> list[Allocation]:
    """Allocations from ``sacct -X --parsable2 --format=<ALLOCATION_FIELDS>``; steps are skipped."""
    allocations = []
    for row in parse_delimited(text, required=ALLOCATION_FIELDS):
        job_id_raw = parse_int(row["JobIDRaw"])
        if job_id_raw is None:
            continue
        state = base_state(row["State"])
        started_at = parse_time(row["Start"])
        allocations.append(
            Allocation(
                job_id_raw=job_id_raw,
                job_id=row["JobID"].strip(),
                account=row["Account"].strip().lower(),
                user=row["User"].strip(),
                state=state,
                submitted_at=parse_time(row["Submit"]),
                started_at=started_at if state != "PENDING" else None,
                ended_at=parse_time(row["End"]) if state not in ("PENDING", "RUNNING") else None,
                gpus=gpus_by_type(row["AllocTRES"]),
                nodes=tuple(expand_hostlist(row["NodeList"])),
            )
        )
    return allocations


def parse_node_events(text: str) -> list[NodeEvent]:
    """Events from ``sacctmgr --parsable2 show event format=<EVENT_FIELDS>``."""
    events = []
    for row in parse_delimited(text, required=EVENT_FIELDS):
        start = parse_time(row["TimeStart"])
        if start is None:
            raise ParseError(f"event without a start time: {row!r}")
        events.append(
            NodeEvent(
                node=row["NodeName"].strip(),
                start=start,
                end=parse_time(row["TimeEnd"]),
                state=row["State"].strip(),
                is_cluster=row["Event"].strip().lower() == "cluster",
            )
        )
    return events


def _requested_gpus(tres: str) -> dict[str, int]:
    """``gres:gpu:rtx4090:2`` (Slurm 22.05) or ``gres/gpu:2`` (later releases) -> GPUs by type."""
    wanted: dict[str, int] = {}
    for item in tres.split(","):
        item = item.strip()
        for prefix in ("gres:", "gres/"):
            if item.startswith(prefix):
                item = item[len(prefix):]
        for gres in parse_gres(item):
            if gres.name == "gpu":
                wanted[gres.gpu_type or ""] = wanted.get(gres.gpu_type or "", 0) + gres.count
    return wanted


def parse_pending(text: str) -> list[PendingJob]:
    """Pending jobs from ``squeue --states=PENDING --Format=<PENDING_FORMAT>``."""
    jobs = []
    for row in parse_delimited(text, required=("JOBID", "ACCOUNT", "USER", "SUBMIT_TIME", "REASON")):
        per_node = _requested_gpus(row.get("TRES_PER_NODE", ""))
        nodes = parse_int(row.get("NODES", "")) or 1
        wanted = {gpu_type: count * nodes for gpu_type, count in per_node.items()}
        for gpu_type, count in _requested_gpus(row.get("TRES_PER_JOB", "")).items():
            wanted[gpu_type] = wanted.get(gpu_type, 0) + count
        typed = sorted(gpu_type for gpu_type in wanted if gpu_type)
        jobs.append(
            PendingJob(
                slurm_job_id=row["JOBID"].strip(),
                account=row["ACCOUNT"].strip().lower(),
                user=row["USER"].strip(),
                submitted_at=parse_time(row["SUBMIT_TIME"]),
                reason=row["REASON"].strip(),
                gpus=sum(wanted.values()),
                gpu_type=",".join(typed) or None,
            )
        )
    return jobs


def parse_sreport_utilization(text: str, tres: str = "gres/gpu") -> SreportUtilization | None:
    """The ``tres`` line of ``sreport -P -t seconds cluster utilization -T <tres>``; None: nothing rolled up.

    sreport prints a banner before its header; the header is the line that starts with ``Cluster|``.
    """
    lines = text.splitlines()
    start = next((index for index, line in enumerate(lines) if line.startswith("Cluster|")), None)
    if start is None:
        return None
    for row in parse_delimited("\n".join(lines[start:]), required=("Allocated", "Down", "Idle", "Reported")):
        if row.get("TRES Name", tres) == tres:
            return SreportUtilization(
                allocated=_seconds(row, "Allocated"),
                down=_seconds(row, "Down"),
                planned_down=_seconds(row, "PLND Down" if "PLND Down" in row else "Planned Down"),
                idle=_seconds(row, "Idle"),
                planned=_seconds(row, "Planned" if "Planned" in row else "Reserved"),
                reported=_seconds(row, "Reported"),
            )
    return None


def _seconds(row: dict[str, str], name: str) -> int:
    """A column of seconds; one this Slurm release does not print counts as 0."""
    value = parse_int(row.get(name) or "0")
    if value is None:
        raise ParseError(f"sreport {name} is not a number of seconds: {row.get(name)!r}")
    return value


@dataclass(frozen=True)
class NodeStatus:
    """One node as ``scontrol --oneliner show node`` prints it: its state flags and the reason it is out, if any."""

    name: str
    state: str
    reason: str | None

    @property
    def out_of_service(self) -> bool:
        """Drained, draining, down or failed: the states ``scontrol update state=resume`` brings back."""
        return any(flag.startswith(("DRAIN", "DOWN", "FAIL")) for flag in self.state.split("+"))


def parse_node_status(text: str) -> NodeStatus:
    """``NodeName=gpu1 ... State=IDLE+DRAIN ... Reason=gpu: Xid 79 on 0000:86:00.0 [root@2026-12-04T20:01:13]``.

    Reason is the record's last field and may hold spaces; the ``[user@time]`` Slurm appends is dropped.
    Other fields hold spaces too (``OS=Linux 6.8.0 #49-Ubuntu ...``), so State= is found as a word.
    """
    line = text.strip().splitlines()[0] if text.strip() else ""
    words = line.split()
    name = next((w.removeprefix("NodeName=") for w in words if w.startswith("NodeName=")), None)
    state = next((w.removeprefix("State=") for w in words if w.startswith("State=")), None)
    if name is None or state is None:
        raise ParseError(f"no NodeName= or State= in {line[:80]!r}")
    reason: str | None = None
    _, found, after = line.partition(" Reason=")
    if found:
        reason = after.rsplit(" [", 1)[0].strip() if after.rstrip().endswith("]") else after.strip()
    return NodeStatus(name=name, state=state, reason=reason or None)


@dataclass(frozen=True)
class NodeReason:
    """A node's state and Slurm's reason for it, from ``sinfo --json``."""

    name: str
    state: str  # upper case, flags joined by "+": IDLE+DRAIN, MIXED+DRAIN, DOWN
    reason: str
    reason_changed_at: dt.datetime | None

    @property
    def out_of_service(self) -> bool:
        return any(flag in self.state for flag in ("DRAIN", "DOWN", "FAIL"))


def _epoch(value: object) -> dt.datetime | None:
    """An epoch number, or Slurm 23.02+'s ``{"set": true, "number": ...}``; None for 0 or unset."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return dt.datetime.fromtimestamp(value, dt.UTC)
    return None


def parse_node_reasons(text: str) -> list[NodeReason]:
    """``sinfo --json``: each node once (sinfo lists a node per partition), Slurm 22.05's and later shapes."""
    document = json.loads(text)
    nodes = document.get("nodes") if isinstance(document, dict) else None
    if not isinstance(nodes, list):
        raise ParseError("sinfo --json has no nodes list")
    found: dict[str, NodeReason] = {}
    for node in nodes:
        if not isinstance(node, dict) or not node.get("name"):
            continue
        state = node.get("state")
        words = [str(word) for word in (state if isinstance(state, list) else [state] if state else [])]
        words += [str(flag) for flag in node.get("state_flags") or [] if str(flag) not in words]
        name = str(node["name"])
        found.setdefault(name, NodeReason(
            name=name, state="+".join(word.upper() for word in words), reason=str(node.get("reason") or ""),
            reason_changed_at=_epoch(node.get("reason_changed_at")),
        ))
    return list(found.values())
