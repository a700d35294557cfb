"""Budget enforcement: cancel the jobs of accounts whose budget is spent.

Only when the operator sets ``billing_cancel_exhausted``; the CLI's billing run
calls ``cancel_exhausted`` after each pass. The cancel runs as the account's
tenant (``SlurmClient.cancel_account_jobs``), so it can reach that account's
jobs and no one else's. Submission refuses new work on its own (402) whatever
this setting says.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from billing.budgets import remaining_nanos
from gpupool.db import utcnow
from gpupool.errors import GpupoolError
from gpupool.models import Account
from gpupool.slurm import SlurmClient

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
