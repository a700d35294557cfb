"""Whole-text helpers over the billing pass's streaming pieces, for tests and benches.

The product reads sacct lazily (``billing.sacct.RunReader.runs``) and meters one
run at a time (``billing.meter.meter_rows``), writing rows while it still reads.
A test or a bench wants the whole answer at once: ``parse_runs`` and ``meter``
are those two, collected into lists.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass

from billing.meter import Billed, LedgerRow, RunKey, meter_rows
from billing.price_book import PriceBook
from billing.sacct import NO_TENANTS, JobRun, RunReader, Tenancy


@dataclass(frozen=True, slots=True)
class ParsedAccounting:
    runs: list[JobRun]
    rows: int  # every row read, including pending and GPU-less jobs


def parse_runs(
    text: str,
    *,
    delimiter: str = "|",
    default_cluster: str | None = None,
    fields: tuple[str, ...] | None = None,
    tenancy: Tenancy = NO_TENANTS,
    refuse_mismatches: bool = True,
) -> ParsedAccounting:
    """Every run of ``text`` that was allocated GPUs, at once."""
    reader = RunReader(
        text, delimiter=delimiter, default_cluster=default_cluster, fields=fields, tenancy=tenancy,
        refuse_mismatches=refuse_mismatches,
    )
    runs = list(reader.runs())
    return ParsedAccounting(runs=runs, rows=reader.rows)


def meter(runs: Iterable[JobRun], billed: MutableMapping[RunKey, Billed], prices: PriceBook) -> list[LedgerRow]:
    """Rows for every second of ``runs`` not yet in ``billed`` (which is updated as rows are made)."""
    return list(meter_rows(runs, billed, prices))
