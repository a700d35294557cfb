"""``GET``/``PUT /account/alerts``: the caller's own spend-alert settings, and what fired this period.

The account is always the caller's own (an admin token may name another with
``?account=``); settings are stored apart from ``accounts``, which holds the
operator's budgets and stays read-only to the API.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from api.audit import audit
from api.billing import visible_account
from api.context import app_state, calendar_now, db_session
from api.routing import ACCOUNT_PARAM, Reply, operation
from api.schemas import AlertsIn, AlertsOut, json_object, request_body
from billing.alerts import alert_status, set_alert_settings
from gpupool.audit import ALERTS_SET
from gpupool.members import ADMINS, READERS_OF_ACCOUNT

alerts_bp = Blueprint("alerts", __name__)


def _answer(account: str) -> Response:
    status = alert_status(db_session(), account, calendar_now(), app_state().settings.currency)
    return jsonify(AlertsOut.model_validate(status).model_dump(mode="json"))


@operation(
    alerts_bp, "GET", "/account/alerts", roles=READERS_OF_ACCOUNT,
    summary="Spend-alert thresholds, each budget's figures and the thresholds fired this period",
    parameters=[ACCOUNT_PARAM], replies={"200": Reply("Alerts", AlertsOut)}, errors=(404,),
)
def get_alerts() -> Response:
    return _answer(visible_account())


@operation(
    alerts_bp, "PUT", "/account/alerts", roles=ADMINS,
    summary="Set the account's spend-alert thresholds (percentages 1-100 of its credit / monthly limit, at most 10) and run-out forecast",
    parameters=[ACCOUNT_PARAM], request=AlertsIn, replies={"200": Reply("Alerts", AlertsOut)}, errors=(400, 404, 415, 422),
)
def put_alerts() -> Response:
    account = visible_account()
    body = request_body(AlertsIn, json_object())
    session = db_session()
    thresholds = tuple(body.thresholds) if body.thresholds is not None else None
    if "forecast_hours" in body.model_fields_set:
        set_alert_settings(session, account, thresholds, None, calendar_now(), forecast_hours=body.forecast_hours)
    else:
        set_alert_settings(session, account, thresholds, None, calendar_now())
    audit(ALERTS_SET, account=account, target=account, details=body.model_dump(exclude_unset=True))
    session.commit()
    return _answer(account)
