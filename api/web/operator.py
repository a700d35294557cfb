"""The operator's pages (admin tokens only): the report, nodes with their jobs, accounts with budgets.

To anyone else they do not exist (404), as another account's job does not.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from flask import render_template, request
from sqlalchemy import select

from api.context import app_state, calendar_now, db_session, principal
from api.web import charts
from api.web.pages import web_bp
from billing.budgets import balance
from billing.money import format_nanos
from billing.report import build_report, parse_window
from gpupool.errors import NotFound, ServiceUnavailable
from gpupool.models import Account

# A window of up to this many days draws every day, sales or not.
_MAX_DAY_COLUMNS = 62
P = ParamSpec("P")
R = TypeVar("R")


def admin_page(view: Callable[P, R]) -> Callable[P, R]:
    @wraps(view)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        if not principal().is_admin:
            raise NotFound("no such page for your token")
        return view(*args, **kwargs)

    return guarded


@web_bp.get("/admin/nodes")
@admin_page
def nodes() -> str:
    slurm = app_state().slurm
    problem = None
    try:
        node_list = slurm.node_gpus()
        running = slurm.running_gpu_jobs()
    except ServiceUnavailable as exc:
        node_list, running, problem = [], [], exc.message
    jobs_by_node: dict[str, list[dict[str, Any]]] = {}
    for job in running:
        for allocation in job.gpus:
            jobs_by_node.setdefault(allocation.node, []).append(
                {"id": job.display_id, "account": job.account, "user": job.user, "gpus": allocation.indices}
            )
    rows = []
    for node in node_list:
        jobs = jobs_by_node.get(node.name, [])
        total = node.gpu_count
        busy = {index for job in jobs for index in job["gpus"]}
        rows.append(
            {
                "node": node,
                "total": total,
                "busy": len(busy),
                # One cell per GPU index: whose job holds it, if any.
                "slots": [next((job["id"] for job in jobs if index in job["gpus"]), None) for index in range(total)],
                "jobs": jobs,
            }
        )
    return render_template("web/nodes.html", rows=rows, problem=problem)


@web_bp.get("/admin/accounts")
@admin_page
def accounts() -> str:
    database = db_session()
    now = calendar_now()
    currency = app_state().settings.currency
    rows = []
    for account in database.scalars(select(Account).order_by(Account.name)):
        current = balance(database, account.name, now)
        rows.append(
            {
                "name": account.name,
                "gpu_limit": account.gpu_limit,
                "disabled": account.disabled_at is not None,
                "unix_user": account.unix_user,
                "balance": current.as_json(),
                "over": current.remaining_nanos is not None and current.remaining_nanos <= 0,
            }
        )
    return render_template("web/accounts.html", rows=rows, currency=currency, format_nanos=format_nanos)


def _day_columns(report: dict[str, Any], value: Callable[[dict[str, Any]], dict[str, float]]) -> list[tuple[str, dict[str, float]]]:
    """One column per UTC day of the window (only days with sales in windows longer than two months)."""
    by_day = {row["date"]: row for row in report["revenue_by_day"]}
    since = dt.date.fromisoformat(report["since"][:10])
    until = dt.datetime.fromisoformat(report["until"].replace("Z", "+00:00"))
    last = (until - dt.timedelta(seconds=1)).date()
    days = [since + dt.timedelta(days=n) for n in range((last - since).days + 1)]
    dates = [day.isoformat() for day in days] if len(days) <= _MAX_DAY_COLUMNS else sorted(by_day)
    return [(date[5:], value(by_day[date]) if date in by_day else {}) for date in dates]


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h"


def _percent(text: str | None) -> float:
    return float(text) * 100 if text is not None else 0.0


@web_bp.get("/admin/report")
@admin_page
def report() -> str:
    now = calendar_now()
    args = {name: request.args.get(name) or None for name in ("period", "since", "until")}
    since, until = parse_window(args["period"], args["since"], args["until"], now=now)
    app = app_state()
    figures = build_report(db_session(), app.slurm, app.settings, since, until, now).model_dump(mode="json")
    currency = figures["currency"]
    revenue_by_day = charts.stacked_columns(
        _day_columns(figures, lambda row: {"revenue": float(row["amount"])}),
        value_text=lambda amount: f"{amount:,.2f} {currency}",
        label_every=3,
    )
    hours_by_day = charts.stacked_columns(
        _day_columns(figures, lambda row: {t: s / 3600 for t, s in row["gpu_seconds_by_gpu_type"].items()}),
        value_text=lambda hours: f"{hours:,.1f} h",
        label_every=3,
    )
    by_account = charts.horizontal_bars(
        [(row["account"], float(row["amount"])) for row in figures["revenue_by_account"]],
        value_text=lambda amount: f"{amount:,.2f} {currency}",
    )
    utilization_by_node = charts.horizontal_bars(
        [(row["node"], _percent(row["utilization"])) for row in figures["utilization_by_node"]],
        value_text=lambda percent: f"{percent:.1f} %",
        maximum=100.0,
    )
    utilization_by_type = charts.horizontal_bars(
        [(row["gpu_type"], _percent(row["utilization"])) for row in figures["utilization_by_gpu_type"]],
        value_text=lambda percent: f"{percent:.1f} %",
        maximum=100.0,
    )
    return render_template(
        "web/report.html",
        report=figures,
        form={"period": args["period"] or ("" if args["since"] else f"{since:%Y-%m}"), "since": args["since"] or "", "until": args["until"] or ""},
        revenue_by_day=revenue_by_day,
        hours_by_day=hours_by_day,
        by_account=by_account,
        utilization_by_node=utilization_by_node,
        utilization_by_type=utilization_by_type,
        hours=_hours,
        percent=_percent,
    )
