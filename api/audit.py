"""``GET /account/audit``, and ``audit``: what the API's and the pages' actions write to the audit log.

``audit`` fills in who acted and from where from the request itself (the
verified caller, its credential's id, the client's address), so a call site
names only the action, its account and target. Call it before the commit
that makes the change: both land together or neither does.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from api.billing import visible_account
from api.context import db_session, principal
from api.schemas import AuditList, AuditOut
from gpupool import audit as audit_log
from gpupool.clock import utc_text
from gpupool.db import utcnow
from gpupool.errors import ValidationFailed

audit_bp = Blueprint("audit", __name__)

DEFAULT_PAGE = 100


def request_actor() -> audit_log.Actor:
    caller = principal()
    if caller.scope is not None:
        via = audit_log.VIA_KEY
    elif request.blueprint == "web":
        via = audit_log.VIA_PAGE
    else:
        via = audit_log.VIA_TOKEN
    return audit_log.Actor(subject=caller.sub, via=via, credential=caller.jti, address=request.remote_addr)


def audit(action: str, *, account: str, target: str | None = None, details: dict[str, Any] | None = None) -> None:
    """Record ``action`` by the caller in the request's session, to commit with the change itself."""
    audit_log.record(db_session(), request_actor(), action, account=account, target=target, details=details, now=utcnow())


def _number(name: str, default: int | None) -> int | None:
    text = request.args.get(name)
    if text is None:
        return default
    if not text.isdigit() or len(text) > 18:
        raise ValidationFailed(f"{name} must be a whole number", field=name)
    return int(text)


@audit_bp.get("/account/audit")
def list_audit() -> Response:
    account = visible_account()
    limit = _number("limit", DEFAULT_PAGE)
    assert limit is not None  # it has a default
    if not 1 <= limit <= audit_log.MAX_PAGE:
        raise ValidationFailed(f"limit must be between 1 and {audit_log.MAX_PAGE}", field="limit")
    rows = audit_log.events(db_session(), account=account, before_id=_number("before", None), limit=limit)
    listed = AuditList(
        events=[
            AuditOut(
                id=row.id, at=utc_text(row.at), actor=row.actor, via=row.via, credential=row.credential,
                address=row.address, action=row.action, target=row.target, details=row.details,
            )
            for row in rows
        ],
        next_before=rows[-1].id if len(rows) == limit else None,
    )
    return jsonify(listed.model_dump(mode="json"))
