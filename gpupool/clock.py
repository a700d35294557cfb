"""What "now" is when gpupool decides by the calendar.

Which month a usage page or a budget counts, which window an operator report
covers by default, which price is in force for a worst-case estimate: each is
a decision on the calendar, and each takes its "now" from one ``Clock``, passed
in like the Slurm client (``create_app(clock=...)``). Production passes
``system_clock``; tests pass a ``FrozenClock`` so that what they assert does
not depend on the day they run (the suite failed once on the first of a month).

Timestamps that only record when something happened (``created_at`` columns,
leases, grace periods measured against Slurm's own times) keep using the real
time: nothing about them changes with the calendar.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

Clock = Callable[[], dt.datetime]
"""Returns an aware UTC datetime."""


def system_clock() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def parse_instant(text: str) -> dt.datetime:
    """An ISO 8601 instant (``Z`` or an offset; a naive one is read as UTC), as aware UTC."""
    moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


def utc_text(moment: dt.datetime, *, timespec: str = "seconds") -> str:
    """``moment`` as ISO 8601 UTC text ending in ``Z``: the one shape gpupool writes instants in.

    ``timespec`` is ``datetime.isoformat``'s: ``"seconds"`` (reports, invoices,
    price tables) or ``"auto"`` (webhook payloads, which carry microseconds
    when the moment has them). A naive ``moment`` is read as UTC, as
    ``parse_instant`` reads naive text: never as the host's local time.
    """
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).replace(tzinfo=None).isoformat(timespec=timespec) + "Z"


class FrozenClock:
    """A clock that says one instant until it is told another."""

    def __init__(self, at: dt.datetime) -> None:
        self.set(at)

    def __call__(self) -> dt.datetime:
        return self._at

    def set(self, at: dt.datetime) -> None:
        if at.tzinfo is None:
            raise ValueError("FrozenClock needs an aware datetime")
        self._at = at.astimezone(dt.UTC)

    def advance(self, delta: dt.timedelta) -> None:
        self._at += delta

    def __repr__(self) -> str:
        return f"FrozenClock({self._at.isoformat()})"
