"""The people inside an account: who may do what, and each one's own limits.

An account's members are token subjects, each with a role:

* ``admin``: everything the account may do: members, keys, webhooks, alert
  thresholds, all of the account's jobs and its invoices;
* ``member``: submit, and see, follow and cancel their own jobs; the account's
  usage totals; their own keys;
* ``viewer``: read only: the account's jobs (not their logs), usage and invoices.

An account with no members keeps the behaviour it had before members
existed: every one of its tokens acts as its admin. Once it has one, a subject
that is not listed is refused (403 ``not_a_member``), so an operator who adds
members never leaves an old token with more than they meant. The first member
an account admin adds through the API enrolls that admin too, so nobody locks
the account out of its own settings.

A member's limits (GPUs at once, spend per UTC month, templates) sit inside the
account's: the API refuses with 402 or 403 for a clear answer. A member who
runs jobs (admin or member) gets a Unix and Slurm user of their own
(``MemberIdentity``, made by ``gpupool member migrate``): their jobs run as it,
so the kernel keeps their files and the Slurm user keeps their jobs from the
account's other members, and their GPU and monthly limits are Slurm limits on
that user's association (``billing.member_limits``). Their templates stay the
API's alone: a member's own sbatch runs any script. Until the operator has
made their user, a member's jobs run as the account's own user, as every
member's did before.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from gpupool.errors import Conflict, Forbidden, NotFound, PaymentRequired, ValidationFailed
from gpupool.models.jobs import Job
from gpupool.models.members import MEMBER_ROLES, AccountMember, MemberIdentity

ADMIN, MEMBER, VIEWER = MEMBER_ROLES
ALL_ROLES = frozenset(MEMBER_ROLES)
WRITERS = frozenset({ADMIN, MEMBER})
ADMINS = frozenset({ADMIN})
READERS_OF_ACCOUNT = frozenset({ADMIN, VIEWER})
# Who submits jobs, and so gets a Unix and Slurm user of their own.
RUNS_JOBS = WRITERS

# The scope of a key a member of each role may make: never more than the role allows.
KEY_SCOPES_BY_ROLE: Mapping[str, frozenset[str]] = {
    ADMIN: frozenset({"read", "submit", "admin"}),
    MEMBER: frozenset({"read", "submit"}),
    VIEWER: frozenset({"read"}),
}


@dataclass(frozen=True)
class Membership:
    """A caller's place in its account: its role and its own limits (None: only the account's apply)."""

    role: str
    gpu_limit: int | None = None
    monthly_limit_nanos: int | None = None
    templates: tuple[str, ...] | None = None
    listed: bool = True  # False: the account has no members, and every token acts as its admin
    # The member's own Unix and Slurm user and its uid (MemberIdentity); None: jobs run as the account's user.
    unix_user: str | None = None
    unix_uid: int | None = None

    @property
    def sees_whole_account(self) -> bool:
        return self.role in READERS_OF_ACCOUNT

    @property
    def has_limits(self) -> bool:
        return self.gpu_limit is not None or self.monthly_limit_nanos is not None


ACCOUNT_WITHOUT_MEMBERS = Membership(role=ADMIN, listed=False)


def _membership(row: AccountMember, unix_user: str | None = None, unix_uid: int | None = None) -> Membership:
    return Membership(
        role=row.role, gpu_limit=row.gpu_limit, monthly_limit_nanos=row.monthly_limit_nanos,
        templates=tuple(row.templates) if row.templates is not None else None,
        unix_user=unix_user, unix_uid=unix_uid,
    )


def membership_of(session: Session, account: str, subject: str) -> Membership | None:
    """The subject's membership; ACCOUNT_WITHOUT_MEMBERS when the account lists none; None: not a member.

    One query on the primary key's prefix: the subject's own row sorts first when there is one,
    with the member's own Unix user, if they have one, from the same statement.
    """
    row = session.execute(
        select(AccountMember, MemberIdentity.unix_user, MemberIdentity.unix_uid)
        .outerjoin(
            MemberIdentity,
            and_(MemberIdentity.account == AccountMember.account, MemberIdentity.subject == AccountMember.subject),
        )
        .where(AccountMember.account == account)
        .order_by((AccountMember.subject == subject).desc())
        .limit(1)
    ).first()
    if row is None:
        return ACCOUNT_WITHOUT_MEMBERS
    member, unix_user, unix_uid = row
    return _membership(member, unix_user, unix_uid) if member.subject == subject else None


def require_member(membership: Membership | None, account: str) -> Membership:
    if membership is None:
        raise Forbidden(
            f"you are not a member of account {account}; ask one of its admins to add you", code="not_a_member"
        )
    return membership


def require_role(membership: Membership, allowed: frozenset[str]) -> None:
    """Forbidden unless the member's role is one of ``allowed`` (each API route declares its own: api.routing)."""
    if membership.role not in allowed:
        raise Forbidden(
            f"your role in this account is {membership.role!r}, which may not do this; "
            f"it needs one of: {', '.join(sorted(allowed))}",
            code="role_insufficient",
            role=membership.role,
        )


def check_member_templates(membership: Membership, template: str) -> None:
    if membership.templates is not None and template not in membership.templates:
        raise Forbidden(
            f"you may submit only these templates: {', '.join(membership.templates)}",
            code="template_not_allowed",
            allowed=list(membership.templates),
        )


def gpus_in_flight(session: Session, account: str, subject: str) -> int:
    """GPUs the member's unfinished jobs hold or wait for: an array counts its tasks that may run at once."""
    at_once = case((Job.array_max_parallel < Job.array_size, Job.array_max_parallel), else_=func.coalesce(Job.array_size, 1))
    total = session.scalar(
        select(func.coalesce(func.sum(Job.gpus * at_once), 0)).where(
            Job.account == account, Job.owner == subject, Job.finished.is_(False)
        )
    )
    return int(total or 0)


def check_member_gpus(session: Session, membership: Membership, account: str, subject: str, asked: int) -> None:
    """402 when this job's GPUs would take the member past their limit; other members are not affected."""
    limit = membership.gpu_limit
    if limit is None or asked <= 0:
        return
    in_use = gpus_in_flight(session, account, subject)
    if in_use + asked > limit:
        raise PaymentRequired(
            f"you may have at most {limit} GPU(s) queued or running in account {account}; "
            f"{in_use} are, and this job asks for {asked}: wait for one to end or cancel one",
            code="member_gpu_limit",
            limit=limit,
            in_use=in_use,
            asked=asked,
        )


def set_member(
    session: Session, account: str, subject: str, *, role: str, gpu_limit: int | None,
    monthly_limit_nanos: int | None, templates: list[str] | None, known_templates: set[str],
    enrolling: str | None, now: dt.datetime,
) -> AccountMember:
    """Add or change a member (the caller commits); ``enrolling``: an admin to add first when the account has none."""
    if role not in MEMBER_ROLES:
        raise ValidationFailed(f"role must be one of {', '.join(MEMBER_ROLES)}", field="role")
    if not 0 < len(subject) <= 255:
        raise ValidationFailed("a member's subject is 1 to 255 characters", field="subject")
    if gpu_limit is not None and gpu_limit < 0:
        raise ValidationFailed("gpu_limit must be 0 or more", field="gpu_limit")
    if monthly_limit_nanos is not None and monthly_limit_nanos < 0:
        raise ValidationFailed("monthly_limit must be 0 or more", field="monthly_limit")
    if templates is not None:
        unknown = sorted(set(templates) - known_templates)
        if unknown or not templates:
            raise ValidationFailed(
                f"templates must be a non-empty list of known templates; unknown: {unknown}", field="templates"
            )
    rows = {row.subject: row for row in session.scalars(
        select(AccountMember).where(AccountMember.account == account).with_for_update()
    )}
    if not rows and enrolling is not None and enrolling != subject:
        session.add(AccountMember(account=account, subject=enrolling, role=ADMIN, created_at=now, updated_at=now))
        rows[enrolling] = AccountMember(account=account, subject=enrolling, role=ADMIN)
    row = rows.get(subject)
    if row is None:
        row = AccountMember(account=account, subject=subject, created_at=now)
        session.add(row)
    _require_an_admin({**{s: r.role for s, r in rows.items()}, subject: role})
    row.role, row.gpu_limit, row.monthly_limit_nanos, row.templates, row.updated_at = (
        role, gpu_limit, monthly_limit_nanos, templates, now,
    )
    return row


def remove_member(session: Session, account: str, subject: str) -> None:
    """Take a subject out of the account (the caller commits); its tokens and keys are refused from then on."""
    rows = {row.subject: row for row in session.scalars(
        select(AccountMember).where(AccountMember.account == account).with_for_update()
    )}
    row = rows.pop(subject, None)
    if row is None:
        raise NotFound(f"{subject!r} is not a member of account {account}")
    _require_an_admin({s: r.role for s, r in rows.items()})
    session.delete(row)


def _require_an_admin(roles: Mapping[str, str]) -> None:
    # Members and no admin: nobody could manage the account but the operator.
    if roles and ADMIN not in roles.values():
        raise Conflict(
            "an account with members needs at least one admin; make another member admin first",
            code="last_admin",
        )


def list_members(session: Session, account: str) -> list[AccountMember]:
    return list(session.scalars(
        select(AccountMember).where(AccountMember.account == account).order_by(AccountMember.subject)
    ))


def identities(session: Session, accounts: list[str] | None = None) -> list[MemberIdentity]:
    """Members' own users (all accounts', or only ``accounts``'), by account and subject."""
    query = select(MemberIdentity).order_by(MemberIdentity.account, MemberIdentity.subject)
    if accounts is not None:
        query = query.where(MemberIdentity.account.in_(accounts))
    return list(session.scalars(query))


def identity_of(session: Session, account: str, subject: str) -> MemberIdentity | None:
    return session.get(MemberIdentity, (account, subject))
