"""Idle GPU-seconds per hour (gpupool.gpu_usage.idle_time), the report's sums (billing.report.idle.idle_figures),
and the session sweep's decision with busy GPUs (gpupool.gpu_usage.idle.busy_at, gpupool.sessions.stop_due): pure."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from billing.report import idle_figures
from gpupool.config import IDLE_MIN_SAMPLE_RETENTION_MIN, load_settings
from gpupool.errors import ConfigError
from gpupool.gpu_usage.idle import busy_at
from gpupool.gpu_usage.idle_time import HOUR, idle_seconds_by_hour, recount, recount_from
from gpupool.gpu_usage.samples import MAX_GAP, GpuKey, Reading
from gpupool.sessions import stop_due

T0 = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.UTC)
GPU0, GPU1 = ("vm", 0), ("vm", 1)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def series(values: list[float | None], start: float = 0, step: float = 1) -> list[Reading]:
    return [Reading(at(start + i * step), value) for i, value in enumerate(values)]


def test_every_stretch_between_two_samples_under_the_threshold_counts_on_every_gpu() -> None:
    samples = {GPU0: series([0.0] * 6), GPU1: series([1.0] * 6)}  # minutes 0..5, both under 5 %
    assert idle_seconds_by_hour(samples, 5) == {T0: 2 * 5 * 60.0}


def test_a_stretch_with_a_busy_end_counts_nothing() -> None:
    # 0-1 idle, 1-2 and 2-3 touch the 50 % sample, 3-4 idle; 5 % itself is not under 5 %.
    assert idle_seconds_by_hour({GPU0: series([0.0, 0.0, 50.0, 0.0, 0.0])}, 5) == {T0: 120.0}
    assert idle_seconds_by_hour({GPU0: series([5.0, 5.0])}, 5) == {}
    assert idle_seconds_by_hour({GPU0: series([4.9, 4.9])}, 5) == {T0: 60.0}


def test_a_sample_without_a_utilization_or_a_gap_over_max_gap_is_no_evidence() -> None:
    assert idle_seconds_by_hour({GPU0: series([0.0, None, 0.0])}, 5) == {}
    gap = MAX_GAP.total_seconds() / 60
    assert idle_seconds_by_hour({GPU0: series([0.0, 0.0], step=gap)}, 5) == {T0: MAX_GAP.total_seconds()}
    assert idle_seconds_by_hour({GPU0: series([0.0, 0.0], step=gap + 0.5)}, 5) == {}


def test_a_stretch_across_an_hours_edge_is_split_at_it_and_the_order_of_samples_does_not_matter() -> None:
    readings = series([0.0] * 3, start=59.5)  # 10:59:30, 11:00:30, 11:01:30
    random.Random(7).shuffle(readings)
    assert idle_seconds_by_hour({GPU0: readings}, 5) == {T0: 30.0, T0 + HOUR: 90.0}


def test_a_pass_recounts_only_the_hours_its_newest_samples_can_touch() -> None:
    samples = {GPU0: series([0.0] * 70)}  # 10:00 .. 11:09, every minute
    # At 11:02 the hour of now - 5 min is 10:00: both hours, whole; samples after now are not read.
    assert recount(samples, 5, at(62)) == {T0: 3600.0, T0 + HOUR: 120.0}
    # At 11:06 only 11:00 can still change.
    assert recount(samples, 5, at(66)) == {T0 + HOUR: 360.0}
    # The samples it needs start one gap before the first hour it recounts; older ones change nothing.
    assert recount_from(at(62)) == T0 - MAX_GAP
    needed = {GPU0: [r for r in samples[GPU0] if r.at >= recount_from(at(62))]}
    assert recount(needed, 5, at(62)) == recount(samples, 5, at(62))


def test_passes_kept_with_the_larger_count_add_up_to_every_stretch_once_however_often_they_run() -> None:
    """A pass every minute, some twice, some missed, as the upsert keeps them: the total of the stretches, no more."""
    values: list[float | None] = [0.0] * 40 + [80.0] * 5 + [0.0] * 50 + [None] + [0.0] * 30
    samples: dict[GpuKey, list[Reading]] = {GPU0: series(values, start=30), GPU1: series(values, start=30)}
    stored: dict[dt.datetime, float] = {}
    minutes = [30 + i for i in range(len(values))]
    passes = [m for m in minutes if m % 7 != 3] + [m for m in minutes if m % 5 == 0]  # some missed, some again
    for minute in sorted(passes):
        for hour, seconds in recount(samples, 5, at(minute)).items():
            stored[hour] = max(stored.get(hour, 0.0), seconds)
    assert stored == idle_seconds_by_hour(samples, 5)
    # 39 + 49 + 29 idle minutes per GPU (a busy stretch and the unread sample break the run).
    assert sum(stored.values()) == 2 * (39 + 49 + 29) * 60.0


def test_samples_are_kept_long_enough_for_an_hour_to_be_recounted() -> None:
    assert dt.timedelta(minutes=IDLE_MIN_SAMPLE_RETENTION_MIN) >= HOUR + 2 * MAX_GAP
    with pytest.raises(ConfigError, match="idle_sample_retention_min must be at least 70"):
        load_settings(environ={}, overrides={"jwt_secret": "x" * 40, "idle_sample_retention_min": 60})


def test_the_report_sums_by_account_and_template_and_the_share_of_what_was_sold() -> None:
    rows = [("acme", "train", 1800.0), ("acme", "jupyter", 599.6), ("beta", "train", 3600.4)]
    figures = idle_figures(rows, gpu_seconds_sold=12_000)
    assert figures == {
        "gpu_seconds": 6000,
        "gpu_hours": "1.67",
        "share_of_gpu_hours_sold": "0.5000",
        "by_account": [
            {"account": "acme", "gpu_seconds": 2400, "gpu_hours": "0.67"},
            {"account": "beta", "gpu_seconds": 3600, "gpu_hours": "1.00"},
        ],
        "by_template": [
            {"template": "jupyter", "gpu_seconds": 600, "gpu_hours": "0.17"},
            {"template": "train", "gpu_seconds": 5400, "gpu_hours": "1.50"},
        ],
    }
    assert idle_figures([], gpu_seconds_sold=0) == {
        "gpu_seconds": 0, "gpu_hours": "0.00", "share_of_gpu_hours_sold": None, "by_account": [], "by_template": [],
    }


def test_gpus_are_busy_at_the_latest_sample_at_or_over_the_threshold_on_any_gpu() -> None:
    samples = {GPU0: series([0.0, 90.0, 0.0]), GPU1: series([0.0, 0.0, 5.0, None])}
    assert busy_at(samples, 5) == at(2)  # GPU 1 at exactly 5 % is busy; the unread sample is neither
    assert busy_at({GPU0: series([0.0, 4.0, None])}, 5) is None
    assert busy_at({}, 5) is None


@pytest.mark.parametrize(
    ("active_min", "busy_min", "stopped"),
    [
        (0, None, True),    # no request for the whole 30 min, no busy GPU in the samples
        (0, 25, False),     # a kernel training with the browser closed: busy 5 min ago
        (0, 0, True),       # busy, but the timeout ago
        (10, None, False),  # a request 20 min ago, GPUs idle: not yet
        (10, 5, False),
    ],
)
def test_a_session_stops_when_neither_requests_nor_its_gpus_were_busy_for_its_timeout(
    active_min: int, busy_min: int | None, stopped: bool
) -> None:
    busy = None if busy_min is None else at(busy_min)
    assert stop_due(at(active_min), busy, 30, at(30)) is stopped
