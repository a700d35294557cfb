"""What the idle check reads back of ``gpu_samples``: one GPU's utilization at one moment, and when it counts as idle."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

# Samples further apart than this (or a latest one older than this) are no evidence of idleness.
MAX_GAP = dt.timedelta(minutes=5)

GpuKey = tuple[str, int]  # (node, GPU index on that node)


@dataclass(frozen=True)
class Reading:
    """One GPU's utilization at one moment; None: the exporter reported the GPU but not its load."""

    at: dt.datetime
    utilization_pct: float | None


def is_under(reading: Reading, threshold_pct: float) -> bool:
    """Under the threshold; a reading without a utilization is not (nothing says the GPU was idle)."""
    return reading.utilization_pct is not None and reading.utilization_pct < threshold_pct
