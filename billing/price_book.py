"""The price schedule: unit prices by tier and GPU type over time, pure lookups.

``billing.prices`` loads it from the ``prices`` table and sets new prices;
``billing.meter`` prices each run with it, ``billing.budgets`` a job's worst case.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterable

from gpupool.clock import utc_text
from gpupool.errors import PriceMissing

ANY_GPU_TYPE = "*"
# The tier of full-price runs: Slurm's default QOS. Any other tier is named after its QOS.
NORMAL_TIER = "normal"
# Preemptible runs: the QOS any normal job may preempt (requeue), at the operator's spot price.
SPOT_TIER = "spot"


class _Schedule:
    """Unit prices (nano-units per GPU-second) of one tier, by GPU type over time."""

    def __init__(self, prices: Iterable[tuple[str, dt.datetime, int]]) -> None:
        by_type: dict[str, list[tuple[dt.datetime, int]]] = {}
        for gpu_type, effective_from, nanos in prices:
            by_type.setdefault(gpu_type, []).append((effective_from, nanos))
        self._starts: dict[str, list[dt.datetime]] = {}
        self._nanos: dict[str, list[int]] = {}
        for gpu_type, entries in by_type.items():
            entries.sort()
            self._starts[gpu_type] = [start for start, _ in entries]
            self._nanos[gpu_type] = [nanos for _, nanos in entries]

    def types(self) -> Iterable[str]:
        return self._starts.keys()

    def covers(self, gpu_type: str, moment: dt.datetime) -> bool:
        """Whether a price of this tier (the type's own or ``*``) is in force at ``moment``."""
        return any(
            (starts := self._starts.get(candidate)) is not None and starts[0] <= moment
            for candidate in (gpu_type, ANY_GPU_TYPE)
        )

    def first_start(self, gpu_type: str) -> dt.datetime | None:
        """When this tier first prices ``gpu_type`` (its own price or ``*``)."""
        firsts = [starts[0] for candidate in (gpu_type, ANY_GPU_TYPE) if (starts := self._starts.get(candidate))]
        return min(firsts) if firsts else None

    def _schedule(self, gpu_type: str, moment: dt.datetime) -> tuple[list[dt.datetime], list[int], int]:
        for candidate in (gpu_type, ANY_GPU_TYPE):
            starts = self._starts.get(candidate)
            if starts:
                index = bisect.bisect_right(starts, moment) - 1
                if index >= 0:
                    return starts, self._nanos[candidate], index
        raise PriceMissing(
            f"no price for GPU type {gpu_type!r} at {utc_text(moment)}; "
            f"set one with `gpupool price set {gpu_type} PRICE --from ...` (or a default for '*')",
            gpu_type=gpu_type,
        )

    def price_at(self, gpu_type: str, moment: dt.datetime) -> tuple[int, dt.datetime | None]:
        own_starts = self._starts.get(gpu_type)
        if own_starts is not None and len(own_starts) == 1 and own_starts[0] <= moment:
            return self._nanos[gpu_type][0], None  # the usual case: one price, ever
        starts, nanos, index = self._schedule(gpu_type, moment)
        next_change = starts[index + 1] if index + 1 < len(starts) else None
        if own_starts is not None and starts is not own_starts and (next_change is None or own_starts[0] < next_change):
            next_change = own_starts[0]
        return nanos[index], next_change

    def price_since(self, gpu_type: str, moment: dt.datetime) -> tuple[int, dt.datetime]:
        starts, nanos, index = self._schedule(gpu_type, moment)
        return nanos[index], starts[index]


_NO_PRICES = _Schedule([])


class PriceBook:
    """Unit prices (nano-units per GPU-second) by tier and GPU type over time.

    A tier is named after the Slurm QOS a run ran under (``normal``, ``spot``).
    Where a tier has no price of its own for a type (nor a ``*`` default) at a
    moment, the ``normal`` tier's price applies: a QOS without a price of its
    own is never cheaper than the full price.
    """

    def __init__(self, prices: Iterable[tuple[str, dt.datetime, int] | tuple[str, dt.datetime, int, str]]) -> None:
        by_tier: dict[str, list[tuple[str, dt.datetime, int]]] = {}
        for entry in prices:
            tier = entry[3] if len(entry) > 3 else NORMAL_TIER  # type: ignore[misc]
            by_tier.setdefault(tier, []).append((entry[0], entry[1], entry[2]))
        self._tiers = {tier: _Schedule(entries) for tier, entries in by_tier.items()}
        self._normal = self._tiers.get(NORMAL_TIER, _NO_PRICES)

    def tier_of(self, gpu_type: str, moment: dt.datetime, tier: str = NORMAL_TIER) -> str:
        """The tier whose price a run under QOS ``tier`` pays at ``moment``."""
        if tier == NORMAL_TIER:
            return NORMAL_TIER
        own = self._tiers.get(tier)
        return tier if own is not None and own.covers(gpu_type, moment) else NORMAL_TIER

    def price_at(self, gpu_type: str, moment: dt.datetime, tier: str = NORMAL_TIER) -> tuple[int, dt.datetime | None]:
        """The unit price in force at ``moment`` and when it next changes (None: not scheduled).

        While the default ``*`` price applies, the type's own first price is a
        change too: from then on the type's schedule replaces the default; so is
        the first price of ``tier`` while the normal price stands in for it.
        """
        if tier == NORMAL_TIER:
            return self._normal.price_at(gpu_type, moment)
        own = self._tiers.get(tier)
        if own is not None and own.covers(gpu_type, moment):
            return own.price_at(gpu_type, moment)
        nanos, next_change = self._normal.price_at(gpu_type, moment)
        first = own.first_start(gpu_type) if own is not None else None
        if first is not None and (next_change is None or first < next_change):
            next_change = first
        return nanos, next_change

    def price_since(self, gpu_type: str, moment: dt.datetime, tier: str = NORMAL_TIER) -> tuple[int, dt.datetime]:
        """The unit price in force at ``moment`` and since when."""
        own = self._tiers.get(tier) if tier != NORMAL_TIER else None
        if own is not None and own.covers(gpu_type, moment):
            return own.price_since(gpu_type, moment)
        return self._normal.price_since(gpu_type, moment)

    def highest(self, gpu_type: str | None, moment: dt.datetime, tier: str = NORMAL_TIER) -> int:
        """Worst-case price at ``moment`` for a GPU of ``gpu_type`` (None: any type) under ``tier``."""
        if gpu_type is not None:
            return self.price_at(gpu_type, moment, tier)[0]
        names = set(self._normal.types())
        own = self._tiers.get(tier)
        if own is not None:
            names.update(own.types())
        known = [
            self.price_at(name, moment, tier)[0]
            for name in names
            if self._normal.covers(name, moment) or (own is not None and own.covers(name, moment))
        ]
        if not known:
            raise PriceMissing("no GPU prices are set; set them with `gpupool price set TYPE PRICE`")
        return max(known)
