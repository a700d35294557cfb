"""Turning job runs into ledger rows: pure arithmetic, no database, no Slurm.

Each run is priced at the tier of the QOS Slurm ran it under (sacct's QOS of
that run, not what the API asked for): a tenant that moves its job to another
QOS, or submits around the API, pays that QOS's price (``PriceBook``).

A run's rows always cover ``[start, start + billed seconds)`` with no gap and
no overlap. Each pass bills from where the run's rows end to its current
``ElapsedRaw``, cut at UTC month starts and at price changes, so every row
belongs to one invoice period and carries one unit price.

sacct computes a running job's ``ElapsedRaw`` as "now - start" until
slurmdbd hears that the job ended, which can be late (slurmdbd was down,
or its queue was behind). A pass can therefore bill a few seconds past the
real end. When the finished record arrives, ``meter_rows`` appends correction
rows (negative seconds) for the excess, so for every finished run the rows'
GPU-seconds add up to GPUs x ``ElapsedRaw`` exactly. The rows written from
the finished record are marked ``final``; after that the run takes no more
rows, so an old snapshot replayed late cannot bill it again. (A finished
record that adds nothing still writes one zero-second final row.)
Nothing is ever updated.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass

from billing.calendar import month_of, month_start, period_of
from billing.sacct import JobRun
from gpupool.errors import PriceMissing

ANY_GPU_TYPE = "*"
# The tier of full-price runs: Slurm's default QOS. Any other tier is named after its QOS.
NORMAL_TIER = "normal"
# Preemptible runs: the QOS any normal job may preempt (requeue), at the operator's spot price.
SPOT_TIER = "spot"
RunKey = tuple[str, int, dt.datetime, str]  # cluster, job id, run start, GPU type


@dataclass(slots=True)
class Billed:
    """What the ledger holds for one run key: net seconds, and whether the run is closed."""

    seconds: int = 0
    final: bool = False
_ONE_SECOND = dt.timedelta(seconds=1)


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
            f"no price for GPU type {gpu_type!r} at {moment:%Y-%m-%dT%H:%M:%SZ}; "
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


@dataclass(slots=True)  # not frozen: built once per row, and a frozen __init__ is slow
class LedgerRow:
    run: JobRun
    gpu_type: str
    gpus: int
    period: str
    interval_from: dt.datetime
    interval_to: dt.datetime
    seconds: int
    gpu_seconds: int
    unit_price_nanos: int
    amount_nanos: int
    correction: bool = False
    final: bool = False
    tier: str = NORMAL_TIER  # the price tier of ``unit_price_nanos``: the run's QOS, or normal (PriceBook)


def _corrections(run: JobRun, gpu_type: str, gpus: int, billed_s: int, prices: PriceBook) -> list[LedgerRow]:
    """Negative rows taking back ``[start + ElapsedRaw, start + billed_s)``, cut as the rows it reverses were."""
    rows: list[LedgerRow] = []
    end = run.start + run.elapsed_s * _ONE_SECOND
    moment = run.start + billed_s * _ONE_SECOND
    while moment > end:
        last_second = moment - _ONE_SECOND
        unit_price, price_start = prices.price_since(gpu_type, last_second, run.qos)
        cut = max(end, month_start(last_second), price_start)
        seconds = (moment - cut) // _ONE_SECOND
        rows.append(
            LedgerRow(
                run=run,
                gpu_type=gpu_type,
                gpus=gpus,
                period=period_of(cut),
                interval_from=cut,
                interval_to=moment,
                seconds=-seconds,
                gpu_seconds=-gpus * seconds,
                unit_price_nanos=unit_price,
                amount_nanos=-gpus * seconds * unit_price,
                correction=True,
                final=True,
                tier=prices.tier_of(gpu_type, last_second, run.qos),
            )
        )
        moment = cut
    rows.reverse()
    return rows


_NOTHING_BILLED = Billed()


def _usage(run: JobRun, gpu_type: str, gpus: int, billed_s: int, prices: PriceBook, *, closes: bool = False) -> list[LedgerRow]:
    """Rows for ``[start + billed_s, start + ElapsedRaw)``, cut at month starts and price changes.

    With ``closes`` (Slurm's finished record) the last row is marked ``final``.
    A finished run seen for the first time, inside one month and one price, is
    the usual case: one pass of the loop, one row.
    """
    rows: list[LedgerRow] = []
    start = run.start
    moment = start + billed_s * _ONE_SECOND if billed_s else start
    end = start + run.elapsed_s * _ONE_SECOND
    while moment < end:
        unit_price, price_change = prices.price_at(gpu_type, moment, run.qos)
        period, month_end = month_of(moment.year, moment.month)
        cut = end if end <= month_end else month_end
        if price_change is not None and price_change < cut:
            cut = price_change
        # ``cut is end`` exactly when no month start or price change comes first; integer
        # arithmetic for that last (usually only) row, as timedelta division is slower.
        seconds = run.elapsed_s - billed_s if cut is end else (cut - moment) // _ONE_SECOND
        billed_s += seconds
        gpu_seconds = gpus * seconds
        rows.append(
            LedgerRow(
                run=run,
                gpu_type=gpu_type,
                gpus=gpus,
                period=period,
                interval_from=moment,
                interval_to=cut,
                seconds=seconds,
                gpu_seconds=gpu_seconds,
                unit_price_nanos=unit_price,
                amount_nanos=gpu_seconds * unit_price,
                final=closes and cut is end,
                tier=prices.tier_of(gpu_type, moment, run.qos),
            )
        )
        moment = cut
    return rows


def _final_marker(run: JobRun, gpu_type: str, gpus: int, prices: PriceBook) -> LedgerRow:
    end = run.start + run.elapsed_s * _ONE_SECOND
    last_second = end - _ONE_SECOND if run.elapsed_s else end
    unit_price, _ = prices.price_since(gpu_type, last_second, run.qos)
    return LedgerRow(
        run=run,
        gpu_type=gpu_type,
        gpus=gpus,
        period=period_of(end),
        interval_from=end,
        interval_to=end,
        seconds=0,
        gpu_seconds=0,
        unit_price_nanos=unit_price,
        amount_nanos=0,
        final=True,
        tier=prices.tier_of(gpu_type, last_second, run.qos),
    )


def meter_rows(runs: Iterable[JobRun], billed: MutableMapping[RunKey, Billed], prices: PriceBook) -> Iterator[LedgerRow]:
    """Rows for every second of ``runs`` not yet in ``billed`` (which is updated as rows are made), one run
    at a time, for a consumer that writes while rows are still being made."""
    for run in runs:
        for gpu_type, gpus in run.gpus.items():
            key = (run.cluster, run.job_id_raw, run.start, gpu_type)
            done = billed.get(key, _NOTHING_BILLED)
            if done.final:
                continue  # Slurm's final record is billed; later snapshots are older news
            if not run.finished:
                if run.elapsed_s > done.seconds:
                    yield from _usage(run, gpu_type, gpus, done.seconds, prices)
                    billed[key] = Billed(run.elapsed_s, False)
                continue  # an older snapshot of a run still going: nothing new
            if run.elapsed_s > done.seconds:
                closing = _usage(run, gpu_type, gpus, done.seconds, prices, closes=True)
            elif run.elapsed_s < done.seconds:
                closing = _corrections(run, gpu_type, gpus, done.seconds, prices)
            elif done.seconds > 0:
                closing = [_final_marker(run, gpu_type, gpus, prices)]
            else:
                continue  # never billed, never ran a second: nothing to close
            yield from closing
            billed[key] = Billed(run.elapsed_s, True)


def billed_by_run(rows: Iterable[tuple[str, int, dt.datetime, str, int, bool]]) -> dict[RunKey, Billed]:
    """``(cluster, job id, start, type, seconds, final)`` ledger rows folded per run key."""
    totals: dict[RunKey, Billed] = {}
    for cluster, job_id_raw, start, gpu_type, seconds, final in rows:
        entry = totals.setdefault((cluster, job_id_raw, start, gpu_type), Billed())
        entry.seconds += seconds
        entry.final = entry.final or bool(final)
    return totals
