"""Prices per tier and GPU type with effective dates. A new price never touches billed rows.

A tier is the Slurm QOS a run ran under: ``normal`` (full price) or ``spot``
(preemptible), see ``billing.price_book.PriceBook``.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from billing.money import format_nanos
from billing.price_book import ANY_GPU_TYPE, NORMAL_TIER, PriceBook
from gpupool.clock import utc_text
from gpupool.errors import Conflict, ValidationFailed
from gpupool.models import LedgerEntry, Price


def load_prices(session: Session) -> PriceBook:
    rows = session.execute(select(Price.gpu_type, Price.effective_from, Price.unit_price_nanos, Price.tier))
    return PriceBook((gpu_type, start, nanos, tier) for gpu_type, start, nanos, tier in rows)


def set_price(
    session: Session, gpu_type: str, unit_price_nanos: int, effective_from: dt.datetime, tier: str = NORMAL_TIER
) -> Price:
    """Schedule ``unit_price_nanos`` per GPU-second for ``gpu_type`` in ``tier`` from ``effective_from`` on.

    Refused when usage of that type after ``effective_from`` is already in
    the ledger, of any tier (a tier's first price changes what its runs
    pay from the normal price): those rows keep the price they were billed at.
    """
    if unit_price_nanos < 0:
        raise ValidationFailed("a price cannot be negative")
    billed_after = select(func.max(LedgerEntry.interval_to)).where(LedgerEntry.interval_to > effective_from)
    if gpu_type != ANY_GPU_TYPE:
        billed_after = billed_after.where(LedgerEntry.gpu_type == gpu_type)
    last_billed = session.scalar(billed_after)
    if last_billed is not None:
        raise Conflict(
            f"usage of {gpu_type} up to {utc_text(last_billed)} is already billed; "
            f"a price change cannot rewrite it, so --from must be {utc_text(last_billed)} or later"
        )
    existing = session.scalars(
        select(Price).where(Price.tier == tier, Price.gpu_type == gpu_type, Price.effective_from == effective_from)
    ).first()
    if existing is not None:
        existing.unit_price_nanos = unit_price_nanos
        return existing
    price = Price(gpu_type=gpu_type, unit_price_nanos=unit_price_nanos, effective_from=effective_from, tier=tier)
    session.add(price)
    session.flush()
    return price


def price_table(session: Session) -> list[tuple[str, str, str, str]]:
    """(GPU type, effective from, unit price, tier) in type, tier and date order."""
    rows = session.execute(
        select(Price.gpu_type, Price.effective_from, Price.unit_price_nanos, Price.tier).order_by(
            Price.gpu_type, Price.tier, Price.effective_from
        )
    )
    return [(gpu_type, utc_text(start), format_nanos(nanos), tier) for gpu_type, start, nanos, tier in rows]
