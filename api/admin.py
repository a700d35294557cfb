"""Views for admin tokens only. To anyone else they do not exist: the same 404 as an unknown URL."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from werkzeug.exceptions import NotFound as UnknownUrl

from api.context import app_state, calendar_now, db_session, principal
from billing.report import build_report, parse_window
from gpupool.errors import NotFound

admin_bp = Blueprint("admin", __name__)


@admin_bp.before_request
def _admins_only() -> None:
    if not principal().is_admin:
        # Word for word what Flask answers for a path it has no route for.
        raise NotFound(UnknownUrl.description or "Not Found")


@admin_bp.get("/admin/report")
def get_report() -> Response:
    """The operator report for ``?period=YYYY-MM`` (default: this month) or ``?since=&until=``."""
    now = calendar_now().replace(microsecond=0)
    since, until = parse_window(
        request.args.get("period"), request.args.get("since"), request.args.get("until"), now=now
    )
    app = app_state()
    report = build_report(db_session(), app.slurm, app.settings, since, until, now)
    response = jsonify(report.as_json())
    response.headers["Cache-Control"] = "private, no-store"
    return response
