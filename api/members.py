"""``/account/members``: the people inside an account, their roles and their own limits (gpupool.members).

Account admins manage them; an operator token may name any account with ``?account=``.
A member with a Unix and Slurm user of their own gets their new limits in Slurm
at once (``billing.member_limits``), after the change is committed.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from api.audit import audit
from api.billing import visible_account
from api.context import app_state, calendar_now, db_session, principal
from api.routing import ACCOUNT_PARAM, Reply, operation
from api.schemas import MemberIn, MemberList, MemberOut, json_object, request_body
from billing.budgets import member_spent_nanos
from billing.calendar import period_of
from billing.member_limits import push_member_limits
from billing.money import format_nanos, parse_nanos
from gpupool.audit import MEMBER_REMOVE, MEMBER_SET
from gpupool.db import utcnow
from gpupool.errors import GpupoolError, RequestError, ServiceUnavailable
from gpupool.members import ADMINS, gpus_in_flight, identity_of, list_members, remove_member, set_member
from gpupool.models.members import AccountMember

members_bp = Blueprint("members", __name__)
_SUBJECT = {"name": "subject", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 255}}


def member_view(row: AccountMember) -> MemberOut:
    """A member as ``GET /account/members`` and the Members page show them: limits, GPUs in flight, this month's spend."""
    session = db_session()
    return MemberOut(
        subject=row.subject,
        role=row.role,
        gpu_limit=row.gpu_limit,
        monthly_limit=None if row.monthly_limit_nanos is None else format_nanos(row.monthly_limit_nanos),
        templates=row.templates,
        gpus_in_flight=gpus_in_flight(session, row.account, row.subject),
        unix_user=None if (identity := identity_of(session, row.account, row.subject)) is None else identity.unix_user,
        spent_this_month=format_nanos(member_spent_nanos(session, row.account, row.subject, period_of(calendar_now()))),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def member_details(row: AccountMember) -> dict[str, Any]:
    """What the audit log keeps of a member's new standing."""
    return {
        "role": row.role, "gpu_limit": row.gpu_limit, "templates": row.templates,
        "monthly_limit": None if row.monthly_limit_nanos is None else format_nanos(row.monthly_limit_nanos),
    }


@operation(
    members_bp, "GET", "/account/members", roles=ADMINS,
    summary="The account's members, their roles, limits and this month's spend (admins)",
    parameters=[ACCOUNT_PARAM], replies={"200": Reply("Members", MemberList)}, errors=(403, 404),
)
def list_account_members() -> Response:
    account = visible_account()
    rows = list_members(db_session(), account)
    return jsonify(MemberList(members=[member_view(row) for row in rows]).model_dump(mode="json"))


@operation(
    members_bp, "PUT", "/account/members/<subject>", roles=ADMINS,
    summary="Add a member or set every setting of one; the first member added enrolls the calling admin",
    parameters=[_SUBJECT, ACCOUNT_PARAM], request=MemberIn,
    replies={"200": Reply("The member", MemberOut)}, errors=(400, 403, 404, 409, 415, 422),
)
def put_member(subject: str) -> Response:
    account = visible_account()
    wanted = request_body(MemberIn, json_object())
    caller = principal()
    session = db_session()
    row = set_member(
        session, account, subject, role=wanted.role, gpu_limit=wanted.gpu_limit,
        monthly_limit_nanos=None if wanted.monthly_limit is None else parse_nanos(wanted.monthly_limit, what="monthly_limit"),
        templates=wanted.templates, known_templates=set(app_state().templates),
        # An account admin adding the account's first member is enrolled as its admin first; an operator is not a member.
        enrolling=None if caller.is_admin or caller.account != account else caller.sub,
        now=utcnow(),
    )
    audit(MEMBER_SET, account=account, target=subject, details=member_details(row))
    session.commit()
    _limits_into_slurm(account, subject)
    return jsonify(member_view(row).model_dump(mode="json"))


@operation(
    members_bp, "DELETE", "/account/members/<subject>", roles=ADMINS,
    summary="Take a subject out of the account; its tokens and keys are refused from then on",
    parameters=[_SUBJECT, ACCOUNT_PARAM], replies={"204": Reply("Removed")}, errors=(403, 404, 409),
)
def delete_member(subject: str) -> tuple[str, int]:
    account = visible_account()
    session = db_session()
    remove_member(session, account, subject)
    audit(MEMBER_REMOVE, account=account, target=subject)
    session.commit()
    _limits_into_slurm(account, subject)
    # Cached token standings carry the old membership until token_check_cache_s passes; keys see it at once.
    return "", 204


def _limits_into_slurm(account: str, subject: str) -> None:
    """The member's limits on their own Slurm user at once, when they have one: a direct sbatch must not outrun them."""
    session = db_session()
    if identity_of(session, account, subject) is None:
        return  # their jobs run as the account's user, under the account's limits alone
    try:
        push_member_limits(session, app_state().slurm, calendar_now(), accounts=[account], subjects=[subject], raise_errors=True)
    except RequestError:
        raise
    except GpupoolError as exc:
        raise ServiceUnavailable(
            f"the change is saved, but Slurm could not be given the member's new limits now ({exc.message}); "
            "the next billing pass (within minutes) gives them, or send the same request again",
            code="member_limits_pending",
        ) from exc
