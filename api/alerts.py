"""``GET``/``PUT /account/alerts``: the caller's own spend-alert thresholds, and which fired this period.

The account is always the caller's own (an admin token may name another with
``?account=``); thresholds are stored apart from ``accounts``, which holds the
operator's budgets and stays read-only to the API.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from api.billing import visible_account
from api.context import app_state, calendar_now, db_session
from api.schemas import json_object
from billing.alerts import alert_status, check_thresholds, set_alert_settings
from gpupool.errors import UnknownFields, ValidationFailed

alerts_bp = Blueprint("alerts", __name__)


@alerts_bp.get("/account/alerts")
def get_alerts() -> Response:
    account = visible_account()
    return jsonify(alert_status(db_session(), account, calendar_now(), app_state().settings.currency))


@alerts_bp.put("/account/alerts")
def put_alerts() -> Response:
    account = visible_account()
    body = json_object()
    if set(body) - {"thresholds"}:
        raise UnknownFields(set(body) - {"thresholds"}, ["thresholds"])
    values = body.get("thresholds")
    if not isinstance(values, list):
        raise ValidationFailed("thresholds must be a list of whole percentages, e.g. [50, 80, 100]", field="thresholds")
    try:
        thresholds = check_thresholds(values)
    except ValueError as exc:
        raise ValidationFailed(str(exc), field="thresholds") from exc
    session = db_session()
    now = calendar_now()
    set_alert_settings(session, account, thresholds, None, now)
    session.commit()
    return jsonify(alert_status(session, account, now, app_state().settings.currency))
