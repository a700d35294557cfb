"""The account's own pages: its API keys, and (for its admins) its members.

Both call the same core functions as ``/keys`` and ``/account/members``
(gpupool.api_keys, gpupool.members), so a page refuses exactly what the API
refuses; the roles each page needs are the API endpoints' (``PAGE_RULES``).
A new key's secret is shown once, on the answer to the form that made it: it
is never put in the session, and the page is not cached.
"""

from __future__ import annotations

from typing import Any

from flask import redirect, render_template, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from api.audit import audit
from api.context import app_state, db_session, principal
from api.errors import status_for
from api.members import member_details, member_view
from api.web.pages import web_bp
from billing.money import MoneyError, parse_nanos
from gpupool import audit as audit_log
from gpupool.api_keys import SCOPES, create_key, key_details, list_keys, require_key_manager, revoke_key
from gpupool.audit import KEY_CREATE, KEY_REVOKE, MEMBER_REMOVE, MEMBER_SET
from gpupool.db import utcnow
from gpupool.errors import GpupoolError, ValidationFailed
from gpupool.members import list_members, remove_member, set_member
from gpupool.models.members import MEMBER_ROLES

ACTIVITY_PAGE = 200

# -- helpers ------------------------------------------------------------------


def _templates_field(text: str) -> list[str] | None:
    """``"a, b"`` -> ["a", "b"]; empty: None (no template limit)."""
    names = [name.strip() for name in text.replace(",", " ").split()]
    return names or None


def _optional_int(text: str, field: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise ValidationFailed(f"{field} must be a whole number", field=field) from exc


# -- keys ---------------------------------------------------------------------


def _keys_page(*, error: GpupoolError | None = None, entered: dict[str, str] | None = None, new_key: dict[str, Any] | None = None) -> tuple[str, int]:
    caller = principal()
    rows = list_keys(db_session(), caller)
    return (
        render_template(
            "web/keys.html",
            keys=rows,
            scopes=SCOPES,
            max_days=app_state().settings.api_key_max_days,
            templates=sorted(app_state().templates),
            entered=entered or {"scope": "read"},
            error=error,
            new_key=new_key,
        ),
        status_for(error) if error is not None else (201 if new_key is not None else 200),
    )


@web_bp.get("/keys")
def keys() -> tuple[str, int]:
    require_key_manager(principal())
    return _keys_page()


@web_bp.post("/keys")
def create_key_page() -> tuple[str, int]:
    entered = request.form.to_dict()
    session = db_session()
    try:
        made = create_key(
            session, app_state().settings, principal(),
            name=entered.get("name", "").strip(), scope=entered.get("scope", "read"),
            days=_optional_int(entered.get("expires_in_days", ""), "expires_in_days"),
            templates=_templates_field(entered.get("templates", "")),
            known_templates=set(app_state().templates), now=utcnow(),
        )
        audit(KEY_CREATE, account=made.row.account, target=made.row.id, details=key_details(made.row))
        session.commit()
    except GpupoolError as exc:
        session.rollback()
        if status_for(exc) >= 500:
            raise
        return _keys_page(error=exc, entered=entered)
    # The only time the secret is shown: in this answer, never in the session or a later page.
    return _keys_page(new_key={"id": made.row.id, "name": made.row.name, "secret": made.secret})


@web_bp.post("/keys/<key_id>/revoke")
def revoke_key_page(key_id: str) -> BaseResponse:
    caller = principal()
    require_key_manager(caller)
    session = db_session()
    row = revoke_key(session, caller, key_id, utcnow())  # another's key is the API's 404
    audit(KEY_REVOKE, account=row.account, target=row.id)
    session.commit()
    return redirect(url_for("web.keys"), code=303)


# -- activity (the audit log) -----------------------------------------------------


@web_bp.get("/activity")
def activity() -> str:
    """The account's audit log, newest first: the page of GET /account/audit."""
    rows = audit_log.events(db_session(), account=principal().account, limit=ACTIVITY_PAGE)
    return render_template("web/activity.html", events=rows, shown=ACTIVITY_PAGE)


# -- members ------------------------------------------------------------------


def _member_rows() -> list[dict[str, Any]]:
    return [member_view(row).model_dump(mode="json") for row in list_members(db_session(), principal().account)]


def _members_page(*, error: GpupoolError | None = None, entered: dict[str, str] | None = None) -> tuple[str, int]:
    return (
        render_template(
            "web/members.html",
            members=_member_rows(),
            roles=MEMBER_ROLES,
            currency=app_state().settings.currency,
            entered=entered or {"role": "member"},
            error=error,
        ),
        status_for(error) if error is not None else 200,
    )


@web_bp.get("/members")
def members() -> tuple[str, int]:
    return _members_page()


@web_bp.post("/members")
def set_member_page() -> BaseResponse | tuple[str, int]:
    entered = request.form.to_dict()
    caller = principal()
    session = db_session()
    try:
        monthly = entered.get("monthly_limit", "").strip()
        try:
            monthly_nanos = parse_nanos(monthly, what="monthly_limit") if monthly else None
        except MoneyError as exc:
            raise ValidationFailed(str(exc), field="monthly_limit") from exc
        row = set_member(
            session, caller.account, entered.get("subject", "").strip(), role=entered.get("role", ""),
            gpu_limit=_optional_int(entered.get("gpu_limit", ""), "gpu_limit"), monthly_limit_nanos=monthly_nanos,
            templates=_templates_field(entered.get("templates", "")),
            known_templates=set(app_state().templates),
            # As PUT /account/members does: an account admin adding the first member is enrolled as its admin.
            enrolling=None if caller.is_admin else caller.sub,
            now=utcnow(),
        )
        audit(MEMBER_SET, account=caller.account, target=row.subject, details=member_details(row))
        session.commit()
    except GpupoolError as exc:
        session.rollback()
        if status_for(exc) >= 500:
            raise
        return _members_page(error=exc, entered=entered)
    return redirect(url_for("web.members"), code=303)


@web_bp.post("/members/<subject>/remove")
def remove_member_page(subject: str) -> BaseResponse:
    session = db_session()
    remove_member(session, principal().account, subject)
    audit(MEMBER_REMOVE, account=principal().account, target=subject)
    session.commit()
    return redirect(url_for("web.members"), code=303)
