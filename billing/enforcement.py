"""Budget enforcement: each account's money as a Slurm limit, and cancelling spent accounts' jobs.

After each pass the CLI's billing run calls ``push_budgets``: every account
with a prepaid credit or a monthly limit gets ``GrpTRESMins=gres/gpu=N`` on its
Slurm association, N being the GPU-minutes what is left of its money buys at
the dearest GPU price now (a disabled account gets 0; an account without a
budget, no limit). slurmctld, with ``AccountingStorageEnforce=safe``, then
starts a job only if its GPUs x time limit, with the unused time of the
account's running jobs, fits in N: by any path (API, sbatch, srun, salloc) no
job starts that its money could not pay for, and an account with nothing
left starts nothing. Slurm counts no past usage against N here (no
priority/multifactor usage decay is configured), so N is "what is left",
recomputed from the ledger every pass.

``cancel_exhausted`` runs only when the operator sets
``billing_cancel_exhausted``. The cancel runs as the account's tenant
(``SlurmClient.cancel_account_jobs``), so it can reach that account's jobs and
no one else's. Submission refuses new work on its own (402) whatever this
setting says.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from billing.budgets import remaining_nanos
from billing.price_book import PriceBook
from billing.prices import load_prices
from gpupool.db import utcnow
from gpupool.errors import GpupoolError, PriceMissing
from gpupool.models import Account
from gpupool.slurm.client import SlurmClient

log = logging.getLogger("gpupool.billing")


def exhausted_accounts(session: Session, now: dt.datetime) -> list[str]:
    """Accounts with a prepaid credit or monthly limit and nothing of it left at ``now``."""
    names = session.scalars(
        select(Account.name).where(
            (Account.prepaid_credit_nanos.is_not(None)) | (Account.monthly_limit_nanos.is_not(None))
        )
    ).all()
    exhausted = []
    for name in names:
        remaining = remaining_nanos(session, name, now)
        if remaining is not None and remaining <= 0:
            exhausted.append(name)
    return exhausted


def cancel_exhausted(session_factory: sessionmaker, slurm: SlurmClient, now: dt.datetime | None = None) -> list[str]:
    """Cancel the jobs of every account whose budget is spent (operator setting billing_cancel_exhausted)."""
    with session_factory() as session:
        names = exhausted_accounts(session, now or utcnow())
    cancelled = []
    for name in names:
        try:
            slurm.cancel_account_jobs(name)
            cancelled.append(name)
        except GpupoolError as exc:
            log.warning("could not cancel the jobs of exhausted account %s: %s", name, exc.message)
    return cancelled


_NANOS_PER_GPU_MINUTE = 60  # prices are per GPU-second


def budget_gpu_minutes(
    remaining: int | None, prices: PriceBook, now: dt.datetime, *, disabled: bool = False
) -> int | None:
    """The Slurm budget for money ``remaining`` (nano-units; None: no budget), at the dearest GPU price.

    Raises PriceMissing when money is left but no price says what it buys.
    """
    if disabled:
        return 0
    if remaining is None:
        return None
    if remaining <= 0:
        return 0
    per_minute = prices.highest(None, now) * _NANOS_PER_GPU_MINUTE
    if per_minute <= 0:
        return None  # GPUs are free: money cannot run out
    return remaining // per_minute


def wanted_budgets(session: Session, now: dt.datetime, accounts: list[str] | None = None) -> dict[str, int | None]:
    """Every account's Slurm budget as the ledger has it now; accounts without a price to convert at are left out."""
    query = select(Account.name, Account.disabled_at, Account.prepaid_credit_nanos, Account.monthly_limit_nanos)
    if accounts is not None:
        query = query.where(Account.name.in_(accounts))
    prices = load_prices(session)
    wanted: dict[str, int | None] = {}
    for name, disabled_at, credit, monthly in session.execute(query):
        remaining = remaining_nanos(session, name, now) if credit is not None or monthly is not None else None
        try:
            wanted[name] = budget_gpu_minutes(remaining, prices, now, disabled=disabled_at is not None)
        except PriceMissing as exc:
            log.warning("account %s keeps its Slurm budget: %s", name, exc.message)
    return wanted


def push_budgets(
    session_factory: sessionmaker, slurm: SlurmClient, now: dt.datetime | None = None, accounts: list[str] | None = None
) -> dict[str, int | None]:
    """Bring every account's Slurm budget (or only ``accounts``') to what the ledger says; the ones changed."""
    with session_factory() as session:
        wanted = wanted_budgets(session, now or utcnow(), accounts)
    current = slurm.budgets()
    changed: dict[str, int | None] = {}
    for name, minutes in sorted(wanted.items()):
        if name not in current or current[name] == {minutes}:
            continue  # not in Slurm (yet), or already right on every cluster
        try:
            slurm.set_budget(name, minutes)
            changed[name] = minutes
        except GpupoolError as exc:
            log.warning("could not set the Slurm budget of account %s: %s", name, exc.message)
    return changed
