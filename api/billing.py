"""Invoices and usage: billing's own functions, behind the API's account rules.

A customer sees only their own account; anyone else's is a 404, exactly as
for an account that does not exist. An admin token may name any account.
"""

from __future__ import annotations

from collections.abc import Iterator

from flask import Blueprint, Response, jsonify, request

from api.context import app_state, calendar_now, db_session, principal
from api.routing import ACCOUNT_PARAM, Reply, operation
from api.schemas import UsageOut
from billing.calendar import PERIOD, check_period, period_of
from billing.invoice import invoice_csv_chunks, invoice_filename
from billing.usage import usage
from gpupool.config import Settings
from gpupool.errors import NotFound
from gpupool.members import ALL_ROLES, READERS_OF_ACCOUNT
from gpupool.models import Account
from gpupool.storage.volumes import volume_usage

billing_bp = Blueprint("billing", __name__)


def visible_account() -> str:
    caller = principal()
    wanted = request.args.get("account") or caller.account
    if wanted != caller.account and not caller.is_admin:
        raise NotFound(f"no account {wanted!r} visible to you")
    if db_session().get(Account, wanted) is None:
        raise NotFound(f"no account {wanted!r} visible to you")
    return wanted


@operation(
    billing_bp, "GET", "/invoices/<period>", roles=READERS_OF_ACCOUNT,
    summary="The account's invoice for a UTC month, as an RFC 4180 CSV attachment",
    parameters=[{"name": "period", "in": "path", "required": True, "schema": {"type": "string", "pattern": PERIOD.pattern}}, ACCOUNT_PARAM],
    replies={"200": Reply("Invoice lines, adjustments, total", content={"text/csv": {"schema": {"type": "string"}}})},
    errors=(400, 404),
)
def get_invoice(period: str) -> Response:
    check_period(period)
    account = visible_account()
    app = app_state()
    currency = app.settings.currency

    def stream() -> Iterator[str]:
        # Its own connection: the request's session is closed before the body is sent.
        session = app.session_factory()
        try:
            yield from invoice_csv_chunks(session.connection(), account, period, currency)
        finally:
            session.close()

    return Response(
        stream(),
        mimetype="text/csv",
        headers={
            "Content-Disposition": f'attachment; filename="{invoice_filename(account, period)}"',
            "Cache-Control": "private, no-store",
        },
    )


@operation(
    billing_bp, "GET", "/usage", roles=ALL_ROLES,
    summary="GPU-seconds and money by GPU type and by day, the balance, and the storage stored and its quota",
    parameters=[{"name": "period", "in": "query", "schema": {"type": "string", "pattern": PERIOD.pattern}, "description": "Default: this month"}, ACCOUNT_PARAM],
    replies={"200": Reply("Usage", UsageOut)},
    errors=(400, 404),
)
def get_usage() -> Response:
    now = calendar_now()
    asked = request.args.get("period")
    period = period_of(now) if asked is None else check_period(asked)
    account = visible_account()
    settings = app_state().settings
    answer = usage(db_session(), account, period, settings.currency, now)
    if settings.storage_root:
        answer["storage"] = storage_usage(settings, db_session().get(Account, account))
    return jsonify(answer)


def storage_usage(settings: Settings, account: Account | None) -> dict[str, int | None]:
    """The account's quota (the database's) and what its filesystem says it holds now: no walk of its files."""
    name = account.name if account is not None else ""
    quota = account.storage_quota(settings.storage_default_quota_bytes) if account is not None else 0
    measured = volume_usage(settings, name) if name else None
    return {
        "quota_bytes": quota,
        "stored_bytes": measured.stored_bytes if measured is not None else None,
        "available_bytes": measured.available_bytes if measured is not None else None,
    }
