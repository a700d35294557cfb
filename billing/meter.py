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

import datetime as dt
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass

from billing.calendar import month_of, month_start, period_of
from billing.price_book import NORMAL_TIER, PriceBook
from billing.sacct import JobRun

RunKey = tuple[str, int, dt.datetime, str]  # cluster, job id, run start, GPU type


@dataclass(slots=True)
class Billed:
    """What the ledger holds for one run key: net seconds, and whether the run is closed."""

    seconds: int = 0
    final: bool = False
_ONE_SECOND = dt.timedelta(seconds=1)


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

    @classmethod
    def priced(
        cls, run: JobRun, gpu_type: str, gpus: int, period: str, interval: tuple[dt.datetime, dt.datetime], seconds: int,
        price: tuple[int, str], *, correction: bool = False, final: bool = False,
    ) -> LedgerRow:
        """``seconds`` (negative: taken back) on ``gpus`` GPUs over ``interval``, at ``price`` (nanos per GPU-second, tier)."""
        gpu_seconds = gpus * seconds
        unit_price, tier = price
        return cls(
            run, gpu_type, gpus, period, interval[0], interval[1], seconds, gpu_seconds, unit_price, gpu_seconds * unit_price,
            correction=correction, final=final, tier=tier,
        )


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
        tier = prices.tier_of(gpu_type, last_second, run.qos)
        rows.append(
            LedgerRow.priced(
                run, gpu_type, gpus, period_of(cut), (cut, moment), -seconds, (unit_price, tier), correction=True, final=True
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
        tier = prices.tier_of(gpu_type, moment, run.qos)
        rows.append(
            LedgerRow.priced(run, gpu_type, gpus, period, (moment, cut), seconds, (unit_price, tier), final=closes and cut is end)
        )
        moment = cut
    return rows


def _final_marker(run: JobRun, gpu_type: str, gpus: int, prices: PriceBook) -> LedgerRow:
    end = run.start + run.elapsed_s * _ONE_SECOND
    last_second = end - _ONE_SECOND if run.elapsed_s else end
    unit_price, _ = prices.price_since(gpu_type, last_second, run.qos)
    tier = prices.tier_of(gpu_type, last_second, run.qos)
    return LedgerRow.priced(run, gpu_type, gpus, period_of(end), (end, end), 0, (unit_price, tier), final=True)


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
