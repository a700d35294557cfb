"""Views for admin tokens only. To anyone else they do not exist: the same 404 as an unknown URL."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from werkzeug.exceptions import NotFound as UnknownUrl

from api.context import app_state, calendar_now, db_session, principal
from api.routing import Reply, operation
from billing.calendar import PERIOD
from billing.report import build_report, parse_window
from billing.report.schema import ReportOut
from gpupool.errors import NotFound
from gpupool.members import ALL_ROLES

admin_bp = Blueprint("admin", __name__)


@admin_bp.before_request
def _admins_only() -> None:
    if not principal().is_admin:
        # Word for word what Flask answers for a path it has no route for.
        raise NotFound(UnknownUrl.description or "Not Found")


@operation(
    admin_bp, "GET", "/admin/report",
    roles=ALL_ROLES,  # operators only, checked by _admins_only
    summary="Admin tokens only (404 to anyone else): revenue, utilization, queue wait and payback",
    parameters=[
        {"name": "period", "in": "query", "schema": {"type": "string", "pattern": PERIOD.pattern}, "description": "A UTC month (default: this month)"},
        {"name": "since", "in": "query", "schema": {"type": "string", "format": "date-time"}, "description": "Range start, instead of period (no zone: UTC)"},
        {"name": "until", "in": "query", "schema": {"type": "string", "format": "date-time"}, "description": "Range end (default: now); at most 400 days after since"},
    ],
    replies={"200": Reply("The report", ReportOut)},
    errors=(400, 404),
)
def get_report() -> Response:
    """The operator report for ``?period=YYYY-MM`` (default: this month) or ``?since=&until=``."""
    now = calendar_now().replace(microsecond=0)
    since, until = parse_window(
        request.args.get("period"), request.args.get("since"), request.args.get("until"), now=now
    )
    app = app_state()
    report = build_report(db_session(), app.slurm, app.settings, since, until, now)
    response = jsonify(report.model_dump(mode="json"))
    response.headers["Cache-Control"] = "private, no-store"
    return response
