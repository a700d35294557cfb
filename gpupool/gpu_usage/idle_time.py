"""Idle GPU-seconds per job and UTC hour: measured by every idle-check pass, kept for the operator report.

The stretch between two consecutive samples of one GPU, no more than ``MAX_GAP``
apart, is idle when both samples are under the job's threshold: the stretches
``judge`` counts towards a job's window. A gap, a sample without a utilization
or a GPU the exporter did not report counts nothing. Summed over the job's
GPUs, a stretch that crosses an hour's edge is split at it.

The threshold is the job's idle policy's, else the settings' default
(``idle_threshold_pct``), also when that policy's window is 0: a window of 0
turns the notice and the cancel off, not the measure of what the GPUs did.

``gpu_samples`` are pruned, so each pass stores what it measured in
``idle_gpu_hours``, inside its transaction. It recomputes the hours its newest
samples can touch (those of ``now - MAX_GAP`` and of ``now``) from every sample
of those hours, and keeps the larger of that and what is stored. A pass run
twice over the same samples, or two passes at once, therefore counts nothing
twice, and a pass that finds fewer samples (some pruned) lowers nothing. That
needs an hour and two gaps of samples: the settings refuse an
``idle_sample_retention_min`` under ``IDLE_MIN_SAMPLE_RETENTION_MIN`` (70).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from sqlalchemy import Executable, func
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from gpupool.gpu_usage.samples import MAX_GAP, GpuKey, Reading, is_under
from gpupool.models import IdleGpuHour

HOUR = dt.timedelta(hours=1)


def hour_of(moment: dt.datetime) -> dt.datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def idle_seconds_by_hour(
    samples: Mapping[GpuKey, Sequence[Reading]], threshold_pct: float, max_gap: dt.timedelta = MAX_GAP
) -> dict[dt.datetime, float]:
    """Idle GPU-seconds of one job per UTC hour (the hour's first instant), from its GPUs' samples in any order.

    Pure: every stretch between consecutive samples of a GPU, at most ``max_gap``
    long, with both ends under ``threshold_pct``, split at the hours it crosses.
    """
    hours: dict[dt.datetime, float] = {}
    for readings in samples.values():
        ordered = sorted(readings, key=lambda reading: reading.at)
        for earlier, later in zip(ordered, ordered[1:], strict=False):
            if later.at - earlier.at > max_gap or not (is_under(earlier, threshold_pct) and is_under(later, threshold_pct)):
                continue
            start = earlier.at
            while start < later.at:
                end = min(later.at, hour_of(start) + HOUR)
                hours[hour_of(start)] = hours.get(hour_of(start), 0.0) + (end - start).total_seconds()
                start = end
    return hours


def recount_from(now: dt.datetime, max_gap: dt.timedelta = MAX_GAP) -> dt.datetime:
    """The oldest sample a pass at ``now`` reads: one gap before the first hour it recounts."""
    return hour_of(now - max_gap) - max_gap


def recount(
    samples: Mapping[GpuKey, Sequence[Reading]], threshold_pct: float, now: dt.datetime, max_gap: dt.timedelta = MAX_GAP
) -> dict[dt.datetime, float]:
    """What a pass at ``now`` stores: the idle GPU-seconds of the hours of ``now - max_gap`` and of ``now``.

    ``samples`` hold every sample from ``recount_from(now)`` on (older ones change nothing); later ones
    than ``now`` are not read. Hours with nothing idle are left out.
    """
    first = hour_of(now - max_gap)
    seen = {gpu: [reading for reading in readings if reading.at <= now] for gpu, readings in samples.items()}
    counted = idle_seconds_by_hour(seen, threshold_pct, max_gap)
    return {hour: seconds for hour, seconds in counted.items() if hour >= first and seconds > 0}


def store_idle_hours(session: Session, job_id: str, hours: Mapping[dt.datetime, float]) -> None:
    """Upsert one job's recounted hours, keeping the larger of the stored count and the new one (caller commits)."""
    if not hours:
        return
    rows = [{"job_id": job_id, "hour": hour, "idle_gpu_seconds": seconds} for hour, seconds in sorted(hours.items())]
    keys = [IdleGpuHour.job_id, IdleGpuHour.hour]
    statement: Executable
    if session.get_bind().dialect.name == "postgresql":
        pg = postgresql.insert(IdleGpuHour).values(rows)
        larger = func.greatest(IdleGpuHour.idle_gpu_seconds, pg.excluded.idle_gpu_seconds)
        statement = pg.on_conflict_do_update(index_elements=keys, set_={"idle_gpu_seconds": larger})
    else:
        lite = sqlite.insert(IdleGpuHour).values(rows)
        # SQLite's max() of two arguments is its GREATEST.
        larger = func.max(IdleGpuHour.idle_gpu_seconds, lite.excluded.idle_gpu_seconds)
        statement = lite.on_conflict_do_update(index_elements=keys, set_={"idle_gpu_seconds": larger})
    session.execute(statement)
