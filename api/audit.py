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
from api.query import int_arg, int_param, optional_int_arg
from api.routing import ACCOUNT_PARAM, Reply, operation
from api.schemas import AuditList, AuditOut
from gpupool import audit as audit_log
from gpupool.clock import utc_text
from gpupool.db import utcnow
from gpupool.members import ADMINS

# Audit rows are numbered by a BIGINT sequence: the largest `before` that can name one.
MAX_EVENT_ID = 2**63 - 1
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


@operation(
    audit_bp, "GET", "/account/audit",
    roles=ADMINS,  # who did what in the account, from where: its admins
    summary="The account's audit log, newest first (account admins)",
    parameters=[
        int_param("limit", 1, audit_log.MAX_PAGE, default=100),
        int_param("before", 1, MAX_EVENT_ID, description="next_before of the previous page"),
        ACCOUNT_PARAM,
    ],
    replies={"200": Reply("Events", AuditList)},
    errors=(400, 403, 404),
)
def list_audit() -> Response:
    account = visible_account()
    limit = int_arg("limit", DEFAULT_PAGE, 1, audit_log.MAX_PAGE)
    before = optional_int_arg("before", 1, MAX_EVENT_ID)
    rows = audit_log.events(db_session(), account=account, before_id=before, limit=limit)
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
