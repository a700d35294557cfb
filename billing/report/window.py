"""The window of a report: a UTC month or a [since, until) range, and how its times print."""

from __future__ import annotations

import datetime as dt

from billing.calendar import PERIOD, check_period, next_month_start
from gpupool.errors import BadRequest

MAX_WINDOW = dt.timedelta(days=400)


def _moment(value: str | dt.datetime, what: str) -> dt.datetime:
    if isinstance(value, dt.datetime):
        moment = value
    else:
        try:
            moment = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise BadRequest(f"{what} {value!r} is not an ISO 8601 time such as 2026-12-01T00:00:00Z", code="bad_window") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)  # no zone: UTC, as everywhere in gpupool
    return moment.astimezone(dt.UTC)


def parse_window(
    period: str | None = None,
    since: str | dt.datetime | None = None,
    until: str | dt.datetime | None = None,
    *,
    now: dt.datetime,
) -> tuple[dt.datetime, dt.datetime]:
    """[since, until) of a report: a UTC month (``period``, default this month), or a range.

    ``since`` alone runs to ``now``. Raises BadRequest (``bad_period``/``bad_window``).
    """
    if period and (since or until):
        raise BadRequest("give a period or a since/until range, not both", code="bad_window")
    if since is None and until is None:
        month = check_period(period) if period else f"{now:%Y-%m}"
        match = PERIOD.match(month)
        assert match is not None
        start = dt.datetime(int(match[1]), int(match[2]), 1, tzinfo=dt.UTC)
        return start, next_month_start(start)
    if since is None:
        raise BadRequest("until needs a since", code="bad_window")
    start = _moment(since, "since")
    end = _moment(until, "until") if until is not None else now.astimezone(dt.UTC)
    if start >= end:
        raise BadRequest("since must be before until", code="bad_window")
    if end - start > MAX_WINDOW:
        raise BadRequest(f"a report covers at most {MAX_WINDOW.days} days", code="bad_window")
    return start, end


