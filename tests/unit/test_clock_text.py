"""utc_text: the one shape gpupool writes instants in."""

from __future__ import annotations

import datetime as dt

from gpupool.clock import utc_text

MOMENT = dt.datetime(2026, 12, 2, 11, 30, 5, 123456, tzinfo=dt.UTC)


def test_seconds_by_default_and_microseconds_on_request() -> None:
    assert utc_text(MOMENT) == "2026-12-02T11:30:05Z"
    assert utc_text(MOMENT, timespec="auto") == "2026-12-02T11:30:05.123456Z"
    assert utc_text(MOMENT.replace(microsecond=0), timespec="auto") == "2026-12-02T11:30:05Z"


def test_aware_non_utc_is_converted() -> None:
    berlin = MOMENT.astimezone(dt.timezone(dt.timedelta(hours=1)))
    assert utc_text(berlin) == "2026-12-02T11:30:05Z"


def test_naive_is_read_as_utc() -> None:
    assert utc_text(MOMENT.replace(tzinfo=None)) == "2026-12-02T11:30:05Z"
