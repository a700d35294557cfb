"""The report's idle GPUs: GPU-seconds the idle check measured under each job's threshold, by account and template.

Read from ``idle_gpu_hours`` (``gpupool.gpu_usage.idle_time``), per job and UTC
hour: an hour counts when it starts inside the window, so a window that starts
or ends inside an hour counts that hour whole or not at all. ``idle_figures``
is the arithmetic, pure.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from billing.report.intervals import gpu_hours, ratio
from gpupool.models import IdleGpuHour, Job


def _seconds(value: float) -> int:
    """Whole GPU-seconds, half up: stretches split at an hour's edge add back up to whole seconds."""
    return int(Decimal(value).quantize(Decimal(1), ROUND_HALF_UP))


def _lines(key: str, sums: dict[str, float]) -> list[dict[str, Any]]:
    return [
        {key: name, "gpu_seconds": _seconds(value), "gpu_hours": gpu_hours(_seconds(value))}
        for name, value in sorted(sums.items())
    ]


def idle_figures(rows: Iterable[tuple[str, str, float]], gpu_seconds_sold: int) -> dict[str, Any]:
    """(account, template, idle GPU-seconds) rows summed in total, by account and by template; the total's share
    of the GPU-seconds sold (4 decimals; None with nothing sold). Pure."""
    by_account: dict[str, float] = {}
    by_template: dict[str, float] = {}
    total = 0.0
    for account, template, seconds in rows:
        by_account[account] = by_account.get(account, 0.0) + seconds
        by_template[template] = by_template.get(template, 0.0) + seconds
        total += seconds
    whole = _seconds(total)
    return {
        "gpu_seconds": whole,
        "gpu_hours": gpu_hours(whole),
        "share_of_gpu_hours_sold": ratio(whole, gpu_seconds_sold),
        "by_account": _lines("account", by_account),
        "by_template": _lines("template", by_template),
    }


def idle_rows(session: Session, since: dt.datetime, until: dt.datetime) -> list[tuple[str, str, float]]:
    """(account, template, idle GPU-seconds) of the hours that start in [since, until)."""
    return [
        (account, template, float(seconds))
        for account, template, seconds in session.execute(
            select(Job.account, Job.template, func.sum(IdleGpuHour.idle_gpu_seconds))
            .join(Job, Job.id == IdleGpuHour.job_id)
            .where(IdleGpuHour.hour >= since, IdleGpuHour.hour < until)
            .group_by(Job.account, Job.template)
            .order_by(Job.account, Job.template)
        )
    ]
