"""Spend, budgets and the worst-case check made before a job is submitted.

An account may carry a prepaid credit (total granted; what is left is the
credit minus all spend ever) and a monthly limit (what is left is the limit
minus this UTC month's spend). With both, the smaller remainder counts.
Spend is exact: ledger amounts plus adjustments, in nano-units, unrounded,
read from the per-period totals the database keeps (``account_spend``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    CompoundSelect,
    String,
    bindparam,
    case,
    cast,
    func,
    literal,
    null,
    select,
    text,
    union_all,
)
from sqlalchemy.orm import Session

from billing.calendar import period_of
from billing.money import format_nanos
from billing.price_book import NORMAL_TIER, SPOT_TIER, PriceBook
from gpupool.db.locks import BUDGET_CHECK
from gpupool.errors import NotFound, PaymentRequired, PriceMissing
from gpupool.models import Account, AccountSpend, Job, LedgerEntry, MemberSpend, Price

# The statements of the check a submit runs are built once, their values bound at each
# execution: SQLAlchemy caches the SQL it compiles, not the statement's objects, and
# building the lock's anew cost 0.36 ms of CPU on every submit.
_ACCOUNT = bindparam("account", type_=String)
_PERIOD = bindparam("period", type_=String)
_SUBJECT = bindparam("subject", type_=String)


def _spent(period: bool) -> ColumnElement[int]:
    """Ledger charges plus adjustments of the account (in the period, or ever), as one SQL expression.

    Read from ``account_spend``, which the database's triggers keep as each ledger row
    or adjustment is inserted: a row per month the account spent in, not one per
    charge, so the check no longer slows as the account's ledger grows.
    """
    spent = select(func.coalesce(func.sum(AccountSpend.ledger_nanos + AccountSpend.adjustment_nanos), 0)).where(
        AccountSpend.account == _ACCOUNT
    )
    if period:
        spent = spent.where(AccountSpend.period == _PERIOD)
    return spent.scalar_subquery()


# What a member's jobs were billed in the period (adjustments are the account's): one row of the
# totals the database keeps (``member_spend``, migration 0025), not a sum over the month's ledger.
_MEMBER_SPENT = (
    select(func.coalesce(func.sum(MemberSpend.ledger_nanos), 0))
    .where(MemberSpend.account == _ACCOUNT, MemberSpend.subject == _SUBJECT, MemberSpend.period == _PERIOD)
    .scalar_subquery()
)
# The account's limits and its spend, ever and this period: one statement, one round trip.
_BALANCE = select(Account.prepaid_credit_nanos, Account.monthly_limit_nanos, _spent(False), _spent(True)).where(
    Account.name == _ACCOUNT
)
# PostgreSQL: a transaction-scoped advisory lock on the account, held until commit,
# taken by the statement that reads the balance (one round trip). Not a row lock
# (FOR NO KEY UPDATE OF accounts): that needs UPDATE on `accounts`, which the API's
# role must not have, since budgets are the operator's; under the service roles
# every submit of an account with a budget failed. The queued jobs are read by
# the next statement, after the lock: they include every submit let in before.
_ACCOUNT_LOCK = func.pg_advisory_xact_lock(BUDGET_CHECK, func.hashtext(Account.name))
_LOCK = _BALANCE.add_columns(_ACCOUNT_LOCK)
_LOCK_WITH_MEMBER = _BALANCE.add_columns(_ACCOUNT_LOCK, _MEMBER_SPENT)
# SQLite: BEGIN IMMEDIATE is the lock (see lock_budget).
_SQLITE_LOCK = _BALANCE.add_columns(null())
_SQLITE_LOCK_WITH_MEMBER = _BALANCE.add_columns(null(), _MEMBER_SPENT)


def _prices_and_committed_query() -> CompoundSelect:
    """The price rows, then the worst case still to come of the account's unfinished API jobs, in a few rows.

    One statement, so the check reads both in one round trip (after the lock:
    the queued jobs must include every submit let in before it). Price rows
    come first, so that their columns' types serve the union's; the job rows
    carry NULL in the price columns, and the price rows in the job columns.

    Each job's worst case is its GPU-seconds at the highest price of its type and
    tier, less what it was billed so far, and never below 0. Jobs not billed yet
    (most of them: queued) add up, GPU-seconds by type, tier and owner (``mine``:
    the subject's), since their worst case is linear in them; a billed job stays
    a row of its own, for its own floor at 0. So an account with thousands of
    queued jobs costs the check a few rows, not one each.
    """
    prices = select(
        literal(_PRICE_ROW, String).label("kind"),
        Price.gpu_type,
        Price.effective_from,
        Price.unit_price_nanos,
        Price.tier,
        cast(null(), BigInteger).label("gpu_seconds"),
        cast(null(), Boolean).label("preemptible"),
        cast(null(), Boolean).label("mine"),
        cast(null(), BigInteger).label("billed"),
    )
    # The correlated sum reads each job's rows through ix_ledger_gpupool_job.
    billed = (
        select(func.coalesce(func.sum(LedgerEntry.amount_nanos), 0))
        .where(LedgerEntry.gpupool_job_id == Job.id)
        .scalar_subquery()
    )
    jobs = (
        select(
            (
                cast(Job.gpus, BigInteger) * func.coalesce(Job.array_size, 1) * Job.time_limit_min * 60
            ).label("gpu_seconds"),
            Job.gpu_type,
            Job.preemptible,
            (Job.owner == _SUBJECT).label("mine"),
            billed.label("billed"),
            Job.id,
        )
        .where(Job.account == _ACCOUNT, Job.finished.is_(False), Job.gpus > 0)
        .subquery()
    )
    committed = select(
        literal(_JOBS_ROW, String),
        jobs.c.gpu_type,
        null(),
        null(),
        null(),
        func.sum(jobs.c.gpu_seconds),
        jobs.c.preemptible,
        jobs.c.mine,
        func.sum(jobs.c.billed),
    ).group_by(
        jobs.c.gpu_type, jobs.c.preemptible, jobs.c.mine, case((jobs.c.billed == 0, None), else_=jobs.c.id)
    )
    return union_all(prices, committed)


_PRICE_ROW, _JOBS_ROW = "price", "jobs"
_PRICES_AND_COMMITTED = _prices_and_committed_query()


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


def _read_balance(row: Sequence[Any] | None, account: str) -> Balance:
    if row is None:
        raise NotFound(f"no account {account!r}")
    return Balance(
        prepaid_credit_nanos=row[0],
        monthly_limit_nanos=row[1],
        spent_total_nanos=int(row[2] or 0),
        spent_period_nanos=int(row[3] or 0),
    )


def balance(session: Session, account: str, now: dt.datetime) -> Balance:
    return _read_balance(session.execute(_BALANCE, {"account": account, "period": period_of(now)}).one_or_none(), account)


def remaining_nanos(session: Session, account: str, now: dt.datetime) -> int | None:
    return balance(session, account, now).remaining_nanos


@dataclass(frozen=True)
class Committed:
    """The worst case still to come of unfinished API jobs: the account's, and of them the member's."""

    account_nanos: int
    member_nanos: int


def _prices_and_committed(
    session: Session, account: str, now: dt.datetime, subject: str | None
) -> tuple[PriceBook, Committed]:
    """The price book, and the worst case still to come from the account's unfinished API jobs (and ``subject``'s), net of what is billed."""
    price_rows: list[tuple[str, dt.datetime, int, str]] = []
    job_rows: list[tuple[Any, str | None, bool, bool, Any]] = []
    rows = session.execute(_PRICES_AND_COMMITTED, {"account": account, "subject": subject})
    for kind, gpu_type, effective_from, unit_price_nanos, tier, gpu_seconds, preemptible, mine, billed in rows:
        if kind == _PRICE_ROW:
            price_rows.append((gpu_type, effective_from, unit_price_nanos, tier))
        else:
            job_rows.append((gpu_seconds, gpu_type, bool(preemptible), bool(mine), billed))
    prices = PriceBook(price_rows)
    total = mine_total = 0
    for gpu_seconds, gpu_type, preemptible, mine, billed in job_rows:
        left = max(0, int(gpu_seconds) * prices.highest(gpu_type, now, _tier(preemptible)) - int(billed))
        total += left
        if mine:
            mine_total += left
    return prices, Committed(total, mine_total)


def _tier(preemptible: bool) -> str:
    return SPOT_TIER if preemptible else NORMAL_TIER


@dataclass(frozen=True)
class BudgetLock:
    """What ``lock_budget`` read under the lock: the account's balance, and a member's spend this month."""

    account: str
    balance: Balance
    member: str | None
    member_spent_nanos: int


def lock_budget(session: Session, account: str, now: dt.datetime, member: str | None = None) -> BudgetLock:
    """Make this transaction the only one checking ``account``'s budget until it ends; the balance, read under it.

    Concurrent submits would otherwise all see the same queued jobs and
    together spend past the budget. The caller inserts its job and commits in
    the same transaction, so the next check, let in by that commit, counts it.
    With ``member``, the same statement reads what that member's jobs were
    billed this month, for ``check_spend``.
    """
    sqlite = session.get_bind().dialect.name == "sqlite"
    if sqlite:
        # The driver begins transactions lazily, at the first write; taking the
        # write lock now makes the next submit wait at its own BEGIN IMMEDIATE
        # (busy timeout). A transaction that already wrote holds that lock anyway.
        if not session.connection().connection.driver_connection.in_transaction:  # type: ignore[union-attr]
            session.execute(text("BEGIN IMMEDIATE"))
    values = {"account": account, "period": period_of(now), "subject": member}
    if member is None:
        statement = _SQLITE_LOCK if sqlite else _LOCK
    else:
        statement = _SQLITE_LOCK_WITH_MEMBER if sqlite else _LOCK_WITH_MEMBER
    row = session.execute(statement, values).one_or_none()
    found = _read_balance(row, account)
    assert row is not None
    return BudgetLock(account, found, member, 0 if member is None else int(row[5] or 0))


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
    """The worst case ``check_spend`` holds a job to, and a quote shows: one computation for both.

    With no GPU type asked for, the job may land on any, so the highest price of any type counts;
    each of an array's tasks may run to its limit; a spot job counts at the spot price.
    """
    gpu_seconds = max(tasks, 1) * max(gpus, 0) * time_limit_min * 60
    try:
        return WorstCase(gpu_seconds, prices.highest(gpu_type, now, _tier(preemptible)))
    except PriceMissing as exc:
        return WorstCase(gpu_seconds, None, exc)


def check_spend(
    session: Session,
    lock: BudgetLock,
    *,
    gpus: int,
    gpu_type: str | None,
    time_limit_min: int,
    currency: str,
    now: dt.datetime,
    tasks: int = 1,
    preemptible: bool = False,
    member_limit_nanos: int | None = None,
) -> None:
    """Raise PaymentRequired unless the job's worst case fits the member's monthly limit (when given), then the account's budget.

    The worst case is GPUs x time limit x price (x tasks, for an array job: each
    task may run to its limit), at the highest price of any type when no type
    is asked for, and at the spot price for a preemptible job; jobs already
    queued or running count with their own worst case, less what they have been
    billed so far (for the member, their own jobs, beside their month's spend).
    (Each run of a requeued spot job may use its whole time limit again, so a
    preempted job can spend past this check; the account's Slurm budget, at the
    dearest price, still stops it.) One read of the prices and one of the
    unfinished jobs (one statement) serve both checks.
    Runs under ``lock``, which the caller's transaction holds until it ends:
    insert the job row and commit in that transaction.
    """
    account = lock.account
    prices: PriceBook | None = None
    committed: Committed | None = None

    def worst() -> tuple[int, Committed]:
        nonlocal prices, committed
        if prices is None or committed is None:
            prices, committed = _prices_and_committed(session, account, now, lock.member)
        cost = worst_case(
            prices, gpus=gpus, gpu_type=gpu_type, time_limit_min=time_limit_min, now=now, tasks=tasks, preemptible=preemptible
        )
        if cost.amount_nanos is None:
            raise cost.price_missing or PriceMissing(f"no price for GPU type {gpu_type!r}")
        return cost.amount_nanos, committed

    if member_limit_nanos is not None:
        if lock.member is None:
            raise ValueError("a member's limit is checked under a lock taken for that member")
        required, queued = worst()
        spent = lock.member_spent_nanos
        left = member_limit_nanos - spent - queued.member_nanos
        if required > left:
            raise PaymentRequired(
                f"this job could cost up to {format_nanos(required)} {currency}, but your own monthly limit in "
                f"account {account} is {format_nanos(member_limit_nanos)} {currency} and {format_nanos(max(left, 0))} "
                "of it is left after this month's spend and your queued and running jobs",
                code="member_budget",
                limit=format_nanos(member_limit_nanos),
                spent_this_month=format_nanos(spent),
                remaining=format_nanos(max(left, 0)),
                required=format_nanos(required),
                currency=currency,
            )
    remaining = lock.balance.remaining_nanos
    if remaining is None:
        return
    if remaining <= 0:
        raise PaymentRequired(
            f"account {account} has no budget left ({format_nanos(remaining)} {currency}); "
            "ask your operator for more credit or a higher monthly limit",
            remaining=format_nanos(remaining),
            required=None,
            currency=currency,
        )
    if gpus <= 0:
        return
    required, queued = worst()
    left = remaining - queued.account_nanos
    if required > left:
        shape = f"{tasks} task(s) x " if tasks > 1 else ""
        raise PaymentRequired(
            f"this job could cost up to {format_nanos(required)} {currency} "
            f"({shape}{gpus} GPU(s) x {time_limit_min} min), but account {account} has "
            f"{format_nanos(max(left, 0))} {currency} left after its queued and running jobs; "
            "ask for fewer GPUs or a shorter time limit",
            remaining=format_nanos(max(left, 0)),
            required=format_nanos(required),
            currency=currency,
        )


def member_spent_nanos(session: Session, account: str, subject: str, period: str) -> int:
    """What the member's jobs were billed in ``period``: ledger rows of jobs they submitted (adjustments are the account's)."""
    return int(session.scalar(select(_MEMBER_SPENT), {"account": account, "subject": subject, "period": period}) or 0)
