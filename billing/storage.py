"""Account storage billed per GiB-month: each billing pass measures, then charges what it can.

A pass records the bytes each account's storage holds now (a ``StorageSample``,
from the filesystem's own count: ``statvfs`` of its volume, never a walk of
its files) and charges the time since that account's previous sample at the
previous sample's bytes: what was stored over an interval is what the pass
that began it saw. A charge row covers at most one UTC hour, so a month's end
falls between rows and each row has one price, the one in effect at its start.

Exact in integers like GPU-seconds: a row holds its byte-seconds, and its
amount is byte-seconds x the price per GiB-month / (GiB x 30 days), rounded
down to the nano (at most a nano per row, under a millionth of the currency
per account per month); invoices round each line to the cent as for GPUs.
Storage kept before the operator's first storage price is charged at 0 and
never again. A pass run again charges nothing twice: an account's samples only
move forward, and a charge is unique per account and start.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from billing.calendar import period_of
from billing.money import format_nanos
from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.errors import Conflict, ValidationFailed
from gpupool.models import Account, StorageCharge, StoragePrice, StorageSample
from gpupool.storage.volumes import volume_usage

# `gpupool price set storage PRICE`: the name no GPU type may take.
STORAGE_PRICE = "storage"
GIB = 1024**3
# A GiB-month is a GiB kept 30 days, whatever the month's length: one price per GiB-hour x 720.
MONTH_SECONDS = 30 * 24 * 3600
HOUR = dt.timedelta(hours=1)

# The bytes an account's storage holds now, or None where it has none mounted on this host.
StoredBytes = Callable[[Settings, str], int | None]


def stored_bytes(settings: Settings, account: str) -> int | None:
    usage = volume_usage(settings, account)
    return None if usage is None else usage.stored_bytes


@dataclass(frozen=True)
class StorageMetered:
    charges: int = 0
    amount_nanos: int = 0
    charged_accounts: frozenset[str] = frozenset()


class StoragePriceBook:
    """The storage price in effect at a moment: 0 before the first one."""

    def __init__(self, prices: Sequence[tuple[dt.datetime, int]]) -> None:
        ordered = sorted(prices)
        self._starts = [start for start, _ in ordered]
        self._nanos = [nanos for _, nanos in ordered]

    def at(self, moment: dt.datetime) -> int:
        index = bisect.bisect_right(self._starts, moment) - 1
        return self._nanos[index] if index >= 0 else 0


def load_storage_prices(session: Session) -> StoragePriceBook:
    rows = session.execute(select(StoragePrice.effective_from, StoragePrice.nanos_per_gib_month))
    return StoragePriceBook([(start, nanos) for start, nanos in rows])


def storage_amount_nanos(byte_seconds: int, nanos_per_gib_month: int) -> int:
    """What ``byte_seconds`` cost at ``nanos_per_gib_month``, rounded down to the nano."""
    return byte_seconds * nanos_per_gib_month // (GIB * MONTH_SECONDS)


def hourly_spans(start: dt.datetime, end: dt.datetime) -> Iterator[tuple[dt.datetime, dt.datetime]]:
    """[start, end) cut at every UTC hour."""
    while start < end:
        following = min(end, start.replace(minute=0, second=0, microsecond=0) + HOUR)
        yield start, following
        start = following


def storage_charges(
    pass_id: int, account: str, since: dt.datetime, until: dt.datetime, stored: int, prices: StoragePriceBook
) -> list[StorageCharge]:
    """The charges for keeping ``stored`` bytes from ``since`` to ``until``."""
    charges = []
    for start, end in hourly_spans(since, until):
        byte_seconds = stored * int((end - start).total_seconds())
        price = prices.at(start)
        charges.append(
            StorageCharge(
                pass_id=pass_id, account=account, period=period_of(start), interval_from=start, interval_to=end,
                stored_bytes=stored, byte_seconds=byte_seconds, nanos_per_gib_month=price,
                amount_nanos=storage_amount_nanos(byte_seconds, price),
            )
        )
    return charges


def meter_storage(
    session: Session, settings: Settings, pass_id: int, now: dt.datetime, measure: StoredBytes = stored_bytes
) -> StorageMetered:
    """Sample every account's storage that is due and charge the intervals the samples close; in the pass's transaction."""
    if not settings.storage_root:
        return StorageMetered()
    now = now.replace(microsecond=0)
    newest = (
        select(StorageSample.account, func.max(StorageSample.sampled_at).label("sampled_at"))
        .group_by(StorageSample.account)
        .subquery()
    )
    last_samples = {
        account: (sampled_at, stored)
        for account, sampled_at, stored in session.execute(
            select(StorageSample.account, StorageSample.sampled_at, StorageSample.stored_bytes).join(
                newest, (newest.c.account == StorageSample.account) & (newest.c.sampled_at == StorageSample.sampled_at)
            )
        )
    }
    prices = load_storage_prices(session)
    due_after = dt.timedelta(seconds=settings.storage_meter_interval_s)
    charges = amount = 0
    charged: set[str] = set()
    for account in session.scalars(select(Account.name).order_by(Account.name)):
        last = last_samples.get(account)
        if last is not None and now - last[0] < due_after:
            continue  # a later pass samples it, so that rows stay few however often passes run
        stored = measure(settings, account)
        if stored is None:
            continue
        session.add(StorageSample(account=account, sampled_at=now, stored_bytes=stored))
        if last is None:
            continue  # its first sample: nothing before it to charge
        rows = storage_charges(pass_id, account, last[0], now, last[1], prices)
        session.add_all(rows)
        charged.add(account)
        charges += len(rows)
        amount += sum(row.amount_nanos for row in rows)
    session.flush()
    return StorageMetered(charges=charges, amount_nanos=amount, charged_accounts=frozenset(charged))


def set_storage_price(session: Session, nanos_per_gib_month: int, effective_from: dt.datetime) -> StoragePrice:
    """Schedule a price per GiB-month from ``effective_from`` on; refused where storage after it is already charged."""
    if nanos_per_gib_month < 0:
        raise ValidationFailed("a price cannot be negative")
    last_charged = session.scalar(select(func.max(StorageCharge.interval_to)).where(StorageCharge.interval_to > effective_from))
    if last_charged is not None:
        raise Conflict(
            f"storage up to {utc_text(last_charged)} is already billed; "
            f"a price change cannot rewrite it, so --from must be {utc_text(last_charged)} or later"
        )
    existing = session.scalars(select(StoragePrice).where(StoragePrice.effective_from == effective_from)).first()
    if existing is not None:
        existing.nanos_per_gib_month = nanos_per_gib_month
        return existing
    price = StoragePrice(effective_from=effective_from, nanos_per_gib_month=nanos_per_gib_month)
    session.add(price)
    session.flush()
    return price


def storage_price_table(session: Session) -> list[tuple[str, str]]:
    """(effective from, price per GiB-month) in date order."""
    rows = session.execute(select(StoragePrice.effective_from, StoragePrice.nanos_per_gib_month).order_by(StoragePrice.effective_from))
    return [(utc_text(start), format_nanos(nanos)) for start, nanos in rows]
