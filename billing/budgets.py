"""Spend, budgets and the worst-case check made before a job is submitted.

An account may carry a prepaid credit (total granted; what is left is the
credit minus all spend ever) and a monthly limit (what is left is the limit
minus this UTC month's spend). With both, the smaller remainder counts.
Spend is exact: ledger amounts plus adjustments, in nano-units, unrounded.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Select, func, select, text
from sqlalchemy.orm import Session

from billing.calendar import period_of
from billing.money import format_nanos
from billing.price_book import NORMAL_TIER, SPOT_TIER, PriceBook
from billing.prices import load_prices
from gpupool.errors import NotFound, PaymentRequired, PriceMissing
from gpupool.models import Account, Adjustment, Job, LedgerEntry


def _spent(account: str, period: str | None = None) -> ColumnElement[int]:
    """Ledger charges plus adjustments of ``account`` (in ``period``, or ever), as one SQL expression."""
    ledger = select(func.coalesce(func.sum(LedgerEntry.amount_nanos), 0)).where(LedgerEntry.account == account)
    adjustments = select(func.coalesce(func.sum(Adjustment.amount_nanos), 0)).where(Adjustment.account == account)
    if period is not None:
        ledger = ledger.where(LedgerEntry.period == period)
        adjustments = adjustments.where(Adjustment.period == period)
    return ledger.scalar_subquery() + adjustments.scalar_subquery()


@dataclass(frozen=True)
class Balance:
    prepaid_credit_nanos: int | None
    monthly_limit_nanos: int | None
    spent_total_nanos: int
    spent_period_nanos: int

    @property
    def remaining_nanos(self) -> int | None:
        remainders = []
        if self.prepaid_credit_nanos is not None:
            remainders.append(self.prepaid_credit_nanos - self.spent_total_nanos)
        if self.monthly_limit_nanos is not None:
            remainders.append(self.monthly_limit_nanos - self.spent_period_nanos)
        return min(remainders) if remainders else None

    def as_json(self) -> dict[str, str | None]:
        def text(value: int | None) -> str | None:
            return None if value is None else format_nanos(value)

        return {
            "prepaid_credit": text(self.prepaid_credit_nanos),
            "monthly_limit": text(self.monthly_limit_nanos),
            "spent_total": text(self.spent_total_nanos),
            "spent_this_month": text(self.spent_period_nanos),
            "remaining": text(self.remaining_nanos),
        }


def _balance_query(account: str, now: dt.datetime) -> Select[int | None, int | None, int, int]:
    """The account's limits and its spend, ever and this month: one statement, one round trip."""
    return select(
        Account.prepaid_credit_nanos, Account.monthly_limit_nanos, _spent(account), _spent(account, period_of(now))
    ).where(Account.name == account)


def _read_balance(session: Session, query: Select[int | None, int | None, int, int], account: str) -> Balance:
    row = session.execute(query).one_or_none()
    if row is None:
        raise NotFound(f"no account {account!r}")
    prepaid, monthly, spent_total, spent_period = row
    return Balance(
        prepaid_credit_nanos=prepaid,
        monthly_limit_nanos=monthly,
        spent_total_nanos=int(spent_total or 0),
        spent_period_nanos=int(spent_period or 0),
    )


def balance(session: Session, account: str, now: dt.datetime) -> Balance:
    return _read_balance(session, _balance_query(account, now), account)


def remaining_nanos(session: Session, account: str, now: dt.datetime) -> int | None:
    return balance(session, account, now).remaining_nanos


def _committed_nanos(session: Session, account: str, prices: PriceBook, now: dt.datetime, owner: str | None = None) -> int:
    """Worst case still to come from the account's (or one member's) unfinished API jobs, net of what is billed."""
    # One statement; the correlated sum reads each job's rows through ix_ledger_gpupool_job.
    billed = (
        select(func.coalesce(func.sum(LedgerEntry.amount_nanos), 0))
        .where(LedgerEntry.gpupool_job_id == Job.id)
        .scalar_subquery()
    )
    query = select(Job.gpus * func.coalesce(Job.array_size, 1), Job.gpu_type, Job.time_limit_min, Job.preemptible, billed).where(
        Job.account == account, Job.finished.is_(False), Job.gpus > 0
    )
    jobs = session.execute(query if owner is None else query.where(Job.owner == owner))
    return sum(
        max(0, gpus * time_limit_min * 60 * prices.highest(gpu_type, now, _tier(preemptible)) - int(nanos))
        for gpus, gpu_type, time_limit_min, preemptible, nanos in jobs
    )


def _tier(preemptible: bool) -> str:
    return SPOT_TIER if preemptible else NORMAL_TIER


def lock_budget(session: Session, account: str, now: dt.datetime) -> Balance:
    """Make this transaction the only one checking ``account``'s budget until it ends; the balance, read under it.

    Concurrent submits would otherwise all see the same queued jobs and
    together spend past the budget. The caller inserts its job and commits in
    the same transaction, so the next check, let in by that commit, counts it.
    """
    if session.get_bind().dialect.name == "sqlite":
        # The driver begins transactions lazily, at the first write; taking the
        # write lock now makes the next submit wait at its own BEGIN IMMEDIATE
        # (busy timeout). A transaction that already wrote holds that lock anyway.
        if not session.connection().connection.driver_connection.in_transaction:  # type: ignore[union-attr]
            session.execute(text("BEGIN IMMEDIATE"))
    # PostgreSQL: FOR NO KEY UPDATE, held until commit. NO KEY, since inserts that
    # reference the account (its jobs, ledger rows) need only KEY SHARE and need
    # not wait. The balance is read by the statement that takes the lock: one
    # round trip, and the check sees the budget as it is now.
    return _read_balance(session, _balance_query(account, now).with_for_update(of=Account, key_share=True), account)


@dataclass(frozen=True)
class WorstCase:
    """A job's most it can cost: every GPU busy for the whole time limit, at the highest price it may run at."""

    gpu_seconds: int
    unit_price_nanos: int | None  # None: no price is set that this job's GPUs would be billed at
    price_missing: PriceMissing | None = None  # then, why

    @property
    def amount_nanos(self) -> int | None:
        return None if self.unit_price_nanos is None else self.gpu_seconds * self.unit_price_nanos


def worst_case(
    prices: PriceBook,
    *,
    gpus: int,
    gpu_type: str | None,
    time_limit_min: int,
    now: dt.datetime,
    tasks: int = 1,
    preemptible: bool = False,
) -> WorstCase:
    """The worst case ``check_submit`` holds a job to, and a quote shows: one computation for both.

    With no GPU type asked for, the job may land on any, so the highest price of any type counts;
    each of an array's tasks may run to its limit; a spot job counts at the spot price.
    """
    gpu_seconds = max(tasks, 1) * max(gpus, 0) * time_limit_min * 60
    try:
        return WorstCase(gpu_seconds, prices.highest(gpu_type, now, _tier(preemptible)))
    except PriceMissing as exc:
        return WorstCase(gpu_seconds, None, exc)


def check_submit(
    session: Session,
    account: str,
    *,
    gpus: int,
    gpu_type: str | None,
    time_limit_min: int,
    currency: str,
    now: dt.datetime,
    tasks: int = 1,
    preemptible: bool = False,
) -> None:
    """Raise PaymentRequired unless the account's budget covers this job's worst case.

    The worst case is GPUs x time limit x price (x tasks, for an array job: each
    task may run to its limit), at the highest price of any type when no type
    is asked for, and at the spot price for a preemptible job; jobs already
    queued or running count with their own worst case, less what they have been
    billed so far. (Each run of a requeued spot job may use its whole time limit
    again, so a preempted job can spend past this check; the account's Slurm
    budget, at the dearest price, still stops it.)
    Holds the account's budget lock (``lock_budget``) until the caller's
    transaction ends: insert the job row and commit in that transaction.
    """
    remaining = lock_budget(session, account, now).remaining_nanos
    if remaining is None:
        return
    left = remaining
    if left <= 0:
        raise PaymentRequired(
            f"account {account} has no budget left ({format_nanos(left)} {currency}); "
            "ask your operator for more credit or a higher monthly limit",
            remaining=format_nanos(left),
            required=None,
            currency=currency,
        )
    if gpus <= 0:
        return
    prices = load_prices(session)
    cost = worst_case(
        prices, gpus=gpus, gpu_type=gpu_type, time_limit_min=time_limit_min, now=now, tasks=tasks, preemptible=preemptible
    )
    if cost.unit_price_nanos is None:
        raise cost.price_missing or PriceMissing(f"no price for GPU type {gpu_type!r}")
    worst = cost.gpu_seconds * cost.unit_price_nanos
    left -= _committed_nanos(session, account, prices, now)
    if worst > left:
        shape = f"{tasks} task(s) x " if tasks > 1 else ""
        raise PaymentRequired(
            f"this job could cost up to {format_nanos(worst)} {currency} "
            f"({shape}{gpus} GPU(s) x {time_limit_min} min), but account {account} has "
            f"{format_nanos(max(left, 0))} {currency} left after its queued and running jobs; "
            "ask for fewer GPUs or a shorter time limit",
            remaining=format_nanos(max(left, 0)),
            required=format_nanos(worst),
            currency=currency,
        )


def member_spent_nanos(session: Session, account: str, subject: str, period: str) -> int:
    """What the member's jobs were billed in ``period``: ledger rows of jobs they submitted (adjustments are the account's)."""
    their_jobs = select(Job.id).where(Job.account == account, Job.owner == subject)
    spent = session.scalar(
        select(func.coalesce(func.sum(LedgerEntry.amount_nanos), 0)).where(
            LedgerEntry.account == account, LedgerEntry.period == period, LedgerEntry.gpupool_job_id.in_(their_jobs)
        )
    )
    return int(spent or 0)


def check_member_spend(
    session: Session,
    account: str,
    subject: str,
    limit_nanos: int,
    *,
    gpus: int,
    gpu_type: str | None,
    time_limit_min: int,
    currency: str,
    now: dt.datetime,
    tasks: int = 1,
    preemptible: bool = False,
) -> None:
    """402 unless the member's own monthly limit covers this job's worst case beside their month's spend and queued jobs.

    The caller holds the account's budget lock (``lock_budget``), as for the account's own check.
    """
    prices = load_prices(session)
    cost = worst_case(
        prices, gpus=gpus, gpu_type=gpu_type, time_limit_min=time_limit_min, now=now, tasks=tasks, preemptible=preemptible
    )
    if cost.amount_nanos is None:
        raise cost.price_missing or PriceMissing(f"no price for GPU type {gpu_type!r}")
    spent = member_spent_nanos(session, account, subject, period_of(now))
    committed = _committed_nanos(session, account, prices, now, owner=subject)
    left = limit_nanos - spent - committed
    if cost.amount_nanos > left:
        raise PaymentRequired(
            f"this job could cost up to {format_nanos(cost.amount_nanos)} {currency}, but your own monthly limit in "
            f"account {account} is {format_nanos(limit_nanos)} {currency} and {format_nanos(max(left, 0))} of it is left "
            "after this month's spend and your queued and running jobs",
            code="member_budget",
            limit=format_nanos(limit_nanos),
            spent_this_month=format_nanos(spent),
            remaining=format_nanos(max(left, 0)),
            required=format_nanos(cost.amount_nanos),
            currency=currency,
        )
