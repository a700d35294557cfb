"""Members' own limits as Slurm limits on their own users' associations.

A member with a Unix and Slurm user of their own (``gpupool.models.MemberIdentity``)
runs jobs under that user's association, below the account's. On it:

- ``GrpTRES=gres/gpu=N``: the member's GPU limit (none: only the account's,
  which Slurm still holds on the account's association above);
- ``GrpTRESMins=gres/gpu=M``: what is left of the member's monthly limit this
  UTC month, in GPU-minutes at the dearest GPU price (``budget_gpu_minutes``,
  the account budget's conversion), which ``AccountingStorageEnforce=safe``
  makes the worst case of every job the member starts, by any path.

A member taken out of the account, or made a viewer, keeps their user, so that
their jobs are still followed and billed; its limits are then 0 and 0, and
nothing new of theirs starts. ``push_member_limits`` runs after every billing
pass (``gpupool billing run``), and for one member at once when their limits
change (the API's ``PUT``/``DELETE /account/members``, ``gpupool member set``).

Templates stay the API's rule alone: Slurm cannot tell one script from another,
and a member's own ``sbatch`` runs whatever script they give it.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from sqlalchemy import and_, select
from sqlalchemy.orm import Session

from billing.calendar import period_of
from billing.enforcement import budget_gpu_minutes
from billing.prices import load_prices
from gpupool.errors import GpupoolError, PriceMissing
from gpupool.members import RUNS_JOBS
from gpupool.models import AccountMember, MemberIdentity, MemberSpend
from gpupool.slurm.client import SlurmClient

log = logging.getLogger("gpupool.billing")


@dataclass(frozen=True)
class MemberLimits:
    """What a member user's association should hold: GPUs at once and GPU-minutes (None: no limit of its own).

    ``minutes_known`` is False when money is left but no price says what it buys:
    the association then keeps the minutes it has.
    """

    gpus: int | None
    gpu_minutes: int | None
    minutes_known: bool = True


# The member's row (if still a member) and this month's spend, beside each identity: one statement.
def _rows_query(period: str) -> object:
    return (
        select(
            MemberIdentity.account, MemberIdentity.unix_user, AccountMember.role, AccountMember.gpu_limit,
            AccountMember.monthly_limit_nanos, MemberSpend.ledger_nanos,
        )
        .outerjoin(
            AccountMember,
            and_(AccountMember.account == MemberIdentity.account, AccountMember.subject == MemberIdentity.subject),
        )
        .outerjoin(
            MemberSpend,
            and_(
                MemberSpend.account == MemberIdentity.account,
                MemberSpend.subject == MemberIdentity.subject,
                MemberSpend.period == period,
            ),
        )
    )


def wanted_member_limits(
    session: Session, now: dt.datetime, accounts: list[str] | None = None, subjects: list[str] | None = None
) -> dict[tuple[str, str], MemberLimits]:
    """Each member user's limits as the database has them now, by (account, user)."""
    query = _rows_query(period_of(now))
    if accounts is not None:
        query = query.where(MemberIdentity.account.in_(accounts))  # type: ignore[attr-defined]
    if subjects is not None:
        query = query.where(MemberIdentity.subject.in_(subjects))  # type: ignore[attr-defined]
    prices = None
    wanted: dict[tuple[str, str], MemberLimits] = {}
    for account, user, role, gpu_limit, monthly, spent in session.execute(query):  # type: ignore[call-overload]
        if role not in RUNS_JOBS:  # taken out of the account, or a viewer: nothing new starts
            wanted[(account, user)] = MemberLimits(0, 0)
            continue
        remaining = None if monthly is None else monthly - int(spent or 0)
        if prices is None and remaining is not None:
            prices = load_prices(session)
        try:
            minutes = None if remaining is None else budget_gpu_minutes(remaining, prices, now)  # type: ignore[arg-type]
        except PriceMissing as exc:
            log.warning("member user %s of account %s keeps its Slurm budget: %s", user, account, exc.message)
            wanted[(account, user)] = MemberLimits(gpu_limit, None, minutes_known=False)
            continue
        wanted[(account, user)] = MemberLimits(gpu_limit, minutes)
    return wanted


def push_member_limits(
    session: Session,
    slurm: SlurmClient,
    now: dt.datetime,
    accounts: list[str] | None = None,
    subjects: list[str] | None = None,
    *,
    raise_errors: bool = False,
) -> dict[tuple[str, str], MemberLimits]:
    """Bring member users' Slurm limits (all, or only those of ``accounts``/``subjects``) to the database's; the ones changed.

    A user that has no association in Slurm yet (``gpupool member migrate`` not
    run to its end) is left out, as an account missing from Slurm is by the budgets'
    push. A write Slurm refuses is logged and the others go on, unless ``raise_errors``.
    """
    wanted = wanted_member_limits(session, now, accounts, subjects)
    if not wanted:
        return {}
    current = slurm.member_limits()
    changed: dict[tuple[str, str], MemberLimits] = {}
    for key, limits in sorted(wanted.items()):
        held = current.get(key)
        if not held:
            continue
        if not limits.minutes_known:
            minutes = {value[1] for value in held}
            limits = MemberLimits(limits.gpus, minutes.pop() if len(minutes) == 1 else None)
        if held == {(limits.gpus, limits.gpu_minutes)}:
            continue
        try:
            slurm.set_member_limits(key[0], key[1], limits.gpus, limits.gpu_minutes)
            changed[key] = limits
        except GpupoolError as exc:
            if raise_errors:
                raise
            log.warning("could not set the Slurm limits of member user %s of account %s: %s", key[1], key[0], exc.message)
    return changed
