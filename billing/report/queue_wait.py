"""Queue wait (Start - Submit of the runs that started in the window) and the jobs waiting now."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from billing.report.intervals import percentile
from billing.report.utilization import gpus_on_nodes
from gpupool.clock import utc_text
from gpupool.slurm.report import Allocation, PendingJob


def queue_waits(
    allocations: Iterable[Allocation], node_types: dict[str, dict[str, int]], since: dt.datetime, end: dt.datetime
) -> dict[str, Any]:
    """p50/p95 of Start - Submit over the GPU runs that started in [since, end), overall, by type and by account."""
    overall: list[int] = []
    by_type: dict[str, list[int]] = {}
    by_account: dict[str, list[int]] = {}
    for allocation in allocations:
        started, submitted = allocation.started_at, allocation.submitted_at
        if started is None or submitted is None or not allocation.gpus or not since <= started < end:
            continue
        wait = max(0, int((started - submitted).total_seconds()))
        overall.append(wait)
        by_account.setdefault(allocation.account, []).append(wait)
        for gpu_type in sorted({cell[1] for cell in gpus_on_nodes(allocation, node_types)}):
            by_type.setdefault(gpu_type, []).append(wait)

    def line(values: list[int]) -> dict[str, Any]:
        return {"jobs": len(values), "p50_s": percentile(values, 50), "p95_s": percentile(values, 95), "max_s": max(values, default=None)}

    return {
        "all": line(overall),
        "by_gpu_type": [{"gpu_type": name, **line(values)} for name, values in sorted(by_type.items())],
        "by_account": [{"account": name, **line(values)} for name, values in sorted(by_account.items())],
    }


def waiting_now_lines(pending: Sequence[PendingJob], now: dt.datetime) -> list[dict[str, Any]]:
    waiting = [
        {
            "slurm_job_id": job.slurm_job_id,
            "account": job.account,
            "user": job.user,
            "gpus": job.gpus,
            "gpu_type": job.gpu_type,
            "reason": job.reason,
            "submitted_at": utc_text(job.submitted_at) if job.submitted_at else None,
            "waiting_s": max(0, int((now - job.submitted_at).total_seconds())) if job.submitted_at else None,
        }
        for job in pending
    ]
    return sorted(waiting, key=lambda job: -(job["waiting_s"] or 0))
