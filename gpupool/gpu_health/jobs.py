"""Ending the jobs that hold a GPU the check found failed; jobs on the node's healthy GPUs go on.

A job on a lost GPU would crash, or hang until its time limit, billed all the
while. So once the check names a failed GPU (``Finding.failed_gpu``), each
running job holding it (``squeue --json``: every node's GRES indices) gets the
failure in its AdminComment (``gpupool.gpu_health.failure``; billing credits
the run by it), then is requeued when it may be, or cancelled otherwise. A job
may be requeued when Slurm says so (``squeue --json``'s ``requeue``: sbatch
``--requeue``, which gpupool renders for ``requeue_on_failure`` and spot jobs,
and ``--no-requeue`` for every other, as the site's JobRequeue would decide
otherwise), or when its QOS is one whose jobs are requeued (spot); it comes
back on a healthy node, as the drained one takes no new job.

Which Slurm GRES index a GPU is: gres.conf's device files, in order, are the
indices 0, 1, ...; the driver numbers /dev/nvidiaN in PCI bus order, as
nvidia-smi's ``index`` does, so nvidia-smi's index N is gres.conf's Nth file.
A GPU that fell off the bus is missing from nvidia-smi's table: the bus ids
the last check saw (``CheckState.gpu_indices``) name it then. A GPU known by
neither ends no job (the node still drains): ending a job on a healthy GPU
would cost its owner, not the operator.

Standard library only: the playbook copies this module to every compute node.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.gpu_health.check import Finding, GpuReading, expand_file_value
from gpupool.gpu_health.failure import GpuFailure

_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^:(,]+)*(?::\d+)?\(IDX:(?P<spec>[0-9,\-]+)\)")


@dataclass(frozen=True)
class HeldGpus:
    """A running job and the GPU indices it holds on this node."""

    job_id: int
    qos: str
    indices: frozenset[int]
    # squeue --json's "requeue" (Slurm 22.05's job_info.requeue): Slurm may requeue the job.
    requeue: bool = False


@dataclass(frozen=True)
class Hit:
    """A job to end, and the failure that ends it."""

    job_id: int
    requeue: bool
    failure: GpuFailure


def gpu_indices(promised_devices: Sequence[str], readings: Sequence[GpuReading]) -> dict[str, int]:
    """Each GPU's Slurm index, by its bus id (nvidia-smi's index, see the module docstring) and by its device file."""
    indices = {path: n for n, path in enumerate(promised_devices)}
    for reading in readings:
        if reading.bus_id is not None and reading.index is not None and reading.index < len(promised_devices):
            indices[reading.bus_id] = reading.index
    return indices


def _index_list(spec: str) -> set[int]:
    indices: set[int] = set()
    for part in filter(None, spec.split(",")):
        low, _, high = part.partition("-")
        indices.update(range(int(low), int(high or low) + 1))
    return indices


def held_gpus(squeue_json: str, node: str) -> list[HeldGpus]:
    """Running jobs holding GPUs on ``node``, from ``squeue --json`` (Slurm 22.05+: one gres_detail per node)."""
    document: Any = json.loads(squeue_json)
    held: list[HeldGpus] = []
    for job in document.get("jobs", []) if isinstance(document, dict) else []:
        if not isinstance(job, dict) or job.get("job_state") != "RUNNING":
            continue
        nodes = expand_file_value(str(job.get("nodes") or ""))
        details = job.get("gres_detail") or []
        if node not in nodes or not isinstance(details, list) or len(details) != len(nodes):
            continue
        detail = str(details[nodes.index(node)])
        indices: set[int] = set()
        for match in _GPU_IDX.finditer(detail):
            indices |= _index_list(match["spec"])
        if indices:
            held.append(
                HeldGpus(int(job["job_id"]), str(job.get("qos") or ""), frozenset(indices), job.get("requeue") is True)
            )
    return held


def hits(
    findings: Sequence[Finding], indices: Mapping[str, int], held: Sequence[HeldGpus], *, node: str, now: dt.datetime,
    requeue_qos: frozenset[str],
) -> tuple[list[Hit], list[str]]:
    """The jobs to end (each once, for the first failure under it), and the failed GPUs no index is known for."""
    unknown: list[str] = []
    failed: dict[int, Finding] = {}
    for finding in findings:
        if finding.failed_gpu is None:
            continue
        index = indices.get(finding.failed_gpu)
        if index is None:
            unknown.append(finding.failed_gpu)
        else:
            failed.setdefault(index, finding)
    ended: list[Hit] = []
    for job in held:
        under = sorted(job.indices & failed.keys())
        if not under:
            continue
        finding = failed[under[0]]
        assert finding.failed_gpu is not None
        failure = GpuFailure(reason=finding.reason, node=node, gpu=finding.failed_gpu, at=now, xid=finding.xid)
        ended.append(Hit(job.job_id, job.requeue or job.qos.lower() in requeue_qos, failure))
    return ended, unknown
