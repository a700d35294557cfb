"""Invoice periods: UTC calendar months, named ``YYYY-MM``. Every period name and month boundary is computed here."""

from __future__ import annotations

import datetime as dt
import functools
import re

from gpupool.errors import BadRequest

# 1970 (Slurm's epoch) to 2999: every month, and the one after it, is a date Python can hold.
PERIOD = re.compile(r"^(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])$")


def check_period(text: str) -> str:
    if not PERIOD.match(text or ""):
        raise BadRequest(f"period {text!r} is not a month from 1970-01 to 2999-12 in the form YYYY-MM", code="bad_period")
    return text


def period_of(moment: dt.datetime) -> str:
    return f"{moment.year:04d}-{moment.month:02d}"


@functools.cache
def month_of(year: int, month: int) -> tuple[str, dt.datetime]:
    """The period name of a month and when the next one starts (cached: the meter asks once per ledger row)."""
    following = dt.datetime(year + 1, 1, 1, tzinfo=dt.UTC) if month == 12 else dt.datetime(year, month + 1, 1, tzinfo=dt.UTC)
    return f"{year:04d}-{month:02d}", following


def month_start(moment: dt.datetime) -> dt.datetime:
    return dt.datetime(moment.year, moment.month, 1, tzinfo=dt.UTC)


def next_month_start(moment: dt.datetime) -> dt.datetime:
    return month_of(moment.year, moment.month)[1]
