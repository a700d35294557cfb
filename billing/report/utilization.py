"""Utilization: sacct's allocations over what sinfo's nodes could give, less slurmdbd's down time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from billing.report.intervals import overlap_s, ratio, union_s
from gpupool.slurm.parse import UNTYPED_GPU
from gpupool.slurm.report import Allocation, NodeEvent, NodeGpuCapacity


def split_count(count: int, parts: int) -> list[int]:
    """``count`` over ``parts`` as evenly as integers allow, the remainder to the first."""
    base, extra = divmod(count, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


def gpus_on_nodes(allocation: Allocation, node_types: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """(node, GPU type, GPUs) of an allocation. sacct gives totals only, so a multi-node job's GPUs
    are split evenly over its nodes (what ``--gres=gpu:N`` allocates); an untyped count takes the
    type of a node that has only one."""
    nodes = allocation.nodes or ("",)
    cells: list[tuple[str, str, int]] = []
    for gpu_type, count in allocation.gpus.items():
        for node, share in zip(nodes, split_count(count, len(nodes)), strict=True):
            if share == 0:
                continue
            known = node_types.get(node, {})
            resolved = next(iter(known)) if gpu_type == UNTYPED_GPU and len(known) == 1 else gpu_type
            cells.append((node, resolved, share))
    return cells


@dataclass
class Cell:
    """One GPU type on one node: what it could give, what was down, what was allocated."""

    gpus: int = 0
    possible: int = 0
    unavailable: int = 0
    allocated: int = 0

    def settle(self) -> None:
        # As slurmdbd's roll-up does: time a job held a GPU is allocated even on a node
        # marked drained, so down time shrinks to what the allocations leave.
        self.unavailable = max(0, min(self.unavailable, self.possible - self.allocated))

    @property
    def available(self) -> int:
        return self.possible - self.unavailable


def utilization_cells(
    nodes: Sequence[NodeGpuCapacity],
    allocations: Iterable[Allocation],
    events: Sequence[NodeEvent],
    since: dt.datetime,
    end: dt.datetime,
) -> dict[tuple[str, str], Cell]:
    """(node, GPU type) -> GPU-seconds possible, down or drained, and allocated in [since, end)."""
    # The cluster counts from its first registration with slurmdbd, as sreport's Reported does.
    registered = [event.start for event in events if event.is_cluster]
    counted_from = max(since, min(registered)) if registered else since
    cluster_down = [(e.start, e.end or end) for e in events if e.is_cluster and "DOWN" in e.state.upper()]
    cells: dict[tuple[str, str], Cell] = {}
    for node in nodes:
        node_spans = cluster_down + [(e.start, e.end or end) for e in events if not e.is_cluster and e.node == node.name]
        down_s = union_s(node_spans, counted_from, end)
        for gpu_type, count in node.gpus.items():
            cells[(node.name, gpu_type)] = Cell(
                gpus=count,
                possible=count * overlap_s(counted_from, end, since, end),
                unavailable=count * down_s,
            )
    node_types = {node.name: node.gpus for node in nodes}
    for allocation in allocations:
        if allocation.started_at is None or not allocation.gpus:
            continue
        seconds = overlap_s(allocation.started_at, allocation.ended_at or end, since, end)
        if seconds == 0:
            continue
        for node_name, gpu_type, gpus in gpus_on_nodes(allocation, node_types):
            cells.setdefault((node_name, gpu_type), Cell()).allocated += gpus * seconds
    for cell in cells.values():
        cell.settle()
    return cells


def utilization_line(key: str, value: str, cells: Iterable[Cell], **extra: Any) -> dict[str, Any]:
    cells = list(cells)
    allocated = sum(cell.allocated for cell in cells)
    available = sum(cell.available for cell in cells)
    return {
        key: value,
        **extra,
        "gpus": sum(cell.gpus for cell in cells),
        "allocated_gpu_seconds": allocated,
        "available_gpu_seconds": available,
        "down_gpu_seconds": sum(cell.unavailable for cell in cells),
        "utilization": ratio(allocated, available),
    }
