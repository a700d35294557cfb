"""Pure arithmetic on seconds and counts: overlaps, unions, percentiles, ratios, GPU-hours."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from decimal import ROUND_HALF_UP, Decimal


def overlap_s(start: dt.datetime, end: dt.datetime, window_start: dt.datetime, window_end: dt.datetime) -> int:
    """Whole seconds of [start, end) inside [window_start, window_end)."""
    seconds = (min(end, window_end) - max(start, window_start)).total_seconds()
    return int(seconds) if seconds > 0 else 0


def union_s(spans: Iterable[tuple[dt.datetime, dt.datetime]], window_start: dt.datetime, window_end: dt.datetime) -> int:
    """Seconds of the window covered by at least one span: overlapping events count once."""
    clipped = sorted((max(a, window_start), min(b, window_end)) for a, b in spans if b > window_start and a < window_end)
    total, reach = 0, window_start
    for start, end in clipped:
        start = max(start, reach)
        if end > start:
            total += int((end - start).total_seconds())
            reach = end
    return total


def percentile(values: Sequence[int], percent: int) -> int | None:
    """Nearest rank: the smallest value with at least ``percent`` % of values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = -(-percent * len(ordered) // 100)  # ceil without floats
    return ordered[max(rank, 1) - 1]


def ratio(numerator: int, denominator: int, places: int = 4) -> str | None:
    """``numerator / denominator`` as decimal text, half up; None when there is nothing to divide by."""
    if denominator <= 0:
        return None
    return str((Decimal(numerator) / Decimal(denominator)).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP))


def divide_half_up(numerator: int, denominator: int) -> int:
    quotient, rest = divmod(abs(numerator), denominator)
    if rest * 2 >= denominator:
        quotient += 1
    return -quotient if numerator < 0 else quotient


def gpu_hours(gpu_seconds: int) -> str:
    """GPU-seconds as hours with 2 decimals, half away from zero."""
    hundredths = divide_half_up(gpu_seconds * 100, 3600)
    sign = "-" if hundredths < 0 else ""
    whole, part = divmod(abs(hundredths), 100)
    return f"{sign}{whole}.{part:02d}"
