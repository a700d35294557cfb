"""The customer's pages: sign-in, jobs, one job, submit, usage and invoices.

Each page reads through the API's own code (the ``GET /jobs`` view, ``submit``,
``billing.usage``), so it shows and refuses exactly what the API would for
the same token. Everything a customer wrote reaches the HTML through Jinja's
autoescaping only.
"""

from __future__ import annotations

import calendar
import datetime as dt
import uuid
from typing import Any

from flask import Blueprint, Response, current_app, g, redirect, render_template, request, session, url_for
from sqlalchemy import select, union
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as BaseResponse

from api import billing as billing_api
from api import outputs as outputs_api
from api import sessions as sessions_api
from api.audit import audit
from api.auth import PAGE_SESSION_KEY, count_unauthenticated, principal_for_token
from api.context import app_state, calendar_now, db_session, principal
from api.errors import status_for
from api.jobs import detail as job_detail
from api.jobs import listing as job_listing
from api.jobs import logs as job_logs_api
from api.jobs import submitting as job_submitting
from api.metrics import JOBS_SUBMITTED
from api.routing import roles_of
from api.submission import quote, request_fingerprint, submit
from api.web import charts
from api.web.forms import RESOURCE_FIELDS, param_fields, submit_body
from api.web.job_outputs import outputs_section
from api.web.session import check_csrf, csrf_token, start_session
from billing.budgets import Balance, balance
from billing.calendar import check_period, period_of
from billing.invoice import invoice_total_cents
from billing.money import format_cents, format_nanos
from billing.usage import gpu_seconds_by_day_and_type, usage
from gpupool import joblogs
from gpupool.audit import SIGNIN, SIGNOUT
from gpupool.db import utcnow
from gpupool.errors import (
    Forbidden,
    GpupoolError,
    LogUnavailable,
    NotFound,
    ServiceUnavailable,
    Unauthorized,
)
from gpupool.members import WRITERS, require_role
from gpupool.models import Account, Adjustment, Job, JobSession, LedgerEntry
from gpupool.render import log_path
from gpupool.sessions import session_view
from gpupool.web_sessions import end_web_session, start_web_session

web_bp = Blueprint("web", __name__, url_prefix="/ui", template_folder="templates", static_folder="static")
# JSON the pages' scripts poll, answered by the API's own views with the session's caller.
web_data_bp = Blueprint("web_data", __name__, url_prefix="/ui/data")

# Reachable without a session.
OPEN_PAGES = frozenset({"web.index", "web.signin", "web.static"})
# Pages that do what an API endpoint does follow that endpoint's roles (declared with it: api.routing);
# the others only read what every role of the account may read.
PAGE_RULES = {
    "web.submit_form": "submit.submit_job",
    "web.submit_job": "submit.submit_job",
    "web.invoices": "billing.get_invoice",
    "web.invoice_csv": "billing.get_invoice",
    "web.open_session": "sessions.get_session",
    "web.open_session_by_label": "sessions.get_session",
    "web_data.job_log_data": "jobs.job_logs",
    "web_data.job_output_data": "outputs.get_output",
    "web_data.job_outputs_tar": "outputs.output_tar",
    "web.keys": "keys.index",
    "web.create_key_page": "keys.create",
    "web.revoke_key_page": "keys.revoke",
    "web.members": "members.list_account_members",
    "web.set_member_page": "members.put_member",
    "web.remove_member_page": "members.delete_member",
    "web.activity": "audit.list_audit",
    "web.files": "files.get_file",
    "web.delete_file_page": "files.delete_file",
    "web.make_folder_page": "files.put_file",
    "web_data.file_data": "files.get_file",
    "web_data.put_file_data": "files.put_file",
}
# What a browser says of where a request comes from (Fetch Metadata): the pages' data answers their own origin's
# scripts and the browser's own navigations only, never another site's page (a session's included), even one
# that could send the cookie. A browser without Fetch Metadata sends none: the cookie's SameSite and the CSRF header hold.
_OWN_ORIGIN = frozenset({"same-origin", "none"})
CONTENT_SECURITY_POLICY = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
# How much of a log the job page shows before its script follows the rest.
LOG_TAIL_BYTES = 64 * 1024
_SUBMISSION_FIELD = "submission"
# The fingerprint of the body the page quoted: the one body its confirm button submits.
_QUOTED_FIELD = "quoted"


# -- plumbing -----------------------------------------------------------------


@web_bp.before_request
def _gate_pages() -> BaseResponse | None:
    if not current_app.config.get("SECRET_KEY"):
        raise ServiceUnavailable(
            "the web pages are closed: set GPUPOOL_WEB_SESSION_SECRET (needed with RS256 tokens)", code="pages_closed"
        )
    if request.method == "POST":
        check_csrf()
    if request.endpoint in OPEN_PAGES:
        return None
    if g.get("principal") is not None:
        _check_page_role()
        return None
    return redirect(url_for("web.signin", next=request.full_path.rstrip("?")))


@web_data_bp.before_request
def _gate_data() -> None:
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in _OWN_ORIGIN:
        raise Forbidden("the pages' data answers the pages of this site only", code="cross_origin")
    if request.method not in ("GET", "HEAD"):
        check_csrf(header=True)
    if g.get("principal") is None:
        raise Unauthorized("sign in again: the session has ended", code="session_ended")
    _check_page_role()


def _check_page_role() -> None:
    membership = principal().membership
    rule = PAGE_RULES.get(request.endpoint or "")
    if membership is not None and rule is not None:
        require_role(membership, roles_of(rule))


def _may_read_logs() -> bool:
    """Logs and outputs alike: what a job wrote may hold its owner's secrets (api.jobs.logs', api.outputs' roles)."""
    membership = principal().membership
    return membership is None or membership.role in WRITERS


def _security_headers(response: Response) -> Response:
    # A stricter policy of the answer's own stays (a downloaded file's: no script, sandboxed).
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Content-Type-Options"] = "nosniff"
    if request.endpoint != "web.static":
        response.headers.setdefault("Cache-Control", "private, no-store")
    return response


web_bp.after_request(_security_headers)
web_data_bp.after_request(_security_headers)


def _error_page(status: int, code: str, message: str) -> tuple[str, int]:
    return render_template("web/error.html", status=status, code=code, message=message), status


@web_bp.errorhandler(GpupoolError)
def _gpupool_error_page(error: GpupoolError) -> tuple[str, int]:
    return _error_page(status_for(error), error.code, error.message)


@web_bp.errorhandler(HTTPException)
def _http_error_page(error: HTTPException) -> tuple[str, int]:
    status = error.code or 500
    return _error_page(status, error.name.lower().replace(" ", "_"), error.description or error.name)


@web_bp.app_context_processor
def _page_context() -> dict[str, Any]:
    return {"csrf_token": csrf_token, "caller": g.get("principal"), "storage_enabled": bool(app_state().settings.storage_root)}


def _safe_next(target: str | None) -> str:
    """Where to go after sign-in: a page of this site only, never an address elsewhere."""
    if target and target.startswith("/ui/") and "//" not in target and "\\" not in target:
        return target
    return url_for("web.jobs")


# -- sign-in ------------------------------------------------------------------


@web_bp.get("/")
def index() -> BaseResponse:
    return redirect(url_for("web.jobs" if g.get("principal") else "web.signin"))


@web_bp.route("/signin", methods=["GET", "POST"])
def signin() -> BaseResponse | tuple[str, int]:
    if request.method == "GET":
        return render_template("web/signin.html", error=None, next=request.args.get("next", "")), 200
    token = request.form.get("token", "").strip()
    try:
        if not token:
            raise Unauthorized("paste the token `gpupool token create` printed for you")
        caller = principal_for_token(token)
    except Unauthorized as exc:
        count_unauthenticated()  # guessing tokens here is throttled as it is on the API
        return render_template("web/signin.html", error=exc.message, next=request.form.get("next", "")), 401
    assert caller.expires_at is not None  # a verified token has its exp
    # The cookie gets a server-side session's id; the token itself is not kept anywhere.
    session_id = start_web_session(db_session(), caller, utcnow())
    g.principal = caller
    audit(SIGNIN, account=caller.account)
    db_session().commit()
    start_session(session_id, caller.expires_at)
    return redirect(_safe_next(request.form.get("next")), code=303)


@web_bp.post("/signout")
def signout() -> BaseResponse:
    session_id = session.get(PAGE_SESSION_KEY)
    if isinstance(session_id, str):
        # Deleted, not just forgotten by this browser: a copy of the cookie no longer works either.
        end_web_session(db_session(), session_id)
        if g.get("principal") is not None:
            audit(SIGNOUT, account=principal().account)
        db_session().commit()
    session.clear()
    return redirect(url_for("web.signin"), code=303)


# -- jobs ---------------------------------------------------------------------


@web_bp.get("/jobs")
def jobs() -> str:
    # The API's own listing: its tenant rules, state filter, paging and Slurm refresh.
    listing = job_listing.list_jobs().get_json()
    return render_template("web/jobs.html", jobs=listing["jobs"], next_cursor=listing["next_cursor"])


def _read_log_tail(job: Job, stream: str) -> tuple[str, int, str | None]:
    """The log's last bytes from a line start, the offset after them, and why none could be read."""
    try:
        # The uid the job ran as: its member's own, or the account's (the API's own rule).
        handle = joblogs.open_log(log_path(job.job_dir, stream), owner_uid=job_logs_api.owner_uid(job))
    except LogUnavailable as exc:
        return "", 0, exc.message
    if handle is None:
        return "", 0, None
    with handle:
        size = joblogs.log_size(handle)
        start = max(0, size - LOG_TAIL_BYTES)
        content, next_offset = joblogs.read_from(handle, start, size - start) if size > start else (b"", start)
    if start > 0 and b"\n" in content:
        content = content[content.index(b"\n") + 1 :]
    return content.decode("utf-8", errors="replace"), next_offset, None


def _timeline(view: dict[str, Any]) -> list[dict[str, Any]]:
    """Submitted, started, ended: each moment known so far, with the time spent since the previous one."""
    moments = [("Submitted", view["submitted_at"]), ("Started", view["started_at"]), ("Ended", view["ended_at"])]
    events: list[dict[str, Any]] = []
    previous: dt.datetime | None = None
    for label, text in moments:
        if text is None:
            continue
        at = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        waited = int((at - previous).total_seconds()) if previous is not None else None
        events.append({"label": label, "at": text, "after_s": waited})
        previous = at
    return events


@web_bp.get("/jobs/<job_id>")
def job(job_id: str) -> str:
    view = job_detail.get_job(job_id).get_json()  # another account's job is the API's 404
    row = db_session().get(Job, view["job_id"])
    assert row is not None
    logs = []
    if _may_read_logs():  # a viewer reads the job, not what it printed
        for stream in ("stdout", "stderr"):
            text, offset, problem = _read_log_tail(row, stream)
            logs.append({"stream": stream, "text": text, "offset": offset, "problem": problem})
    return render_template(
        "web/job.html",
        job=view,
        timeline=_timeline(view),
        session=_session_of_page(view, row) if _may_read_logs() else None,
        usage_chart=_usage_chart(view),
        logs=logs,
        outputs=outputs_section(view) if _may_read_logs() else None,
    )


def _usage_chart(view: dict[str, Any]) -> charts.LineChart | None:
    """The job's recent utilization, one line per GPU; None before any sample."""
    usage = view.get("gpu_usage") or {}
    series = [
        (
            f"{gpu['node']} GPU {gpu['index']}",
            [(_instant(sample["at"]).timestamp(), sample["utilization_pct"]) for sample in gpu["samples"]],
        )
        for gpu in usage.get("gpus", [])
        if gpu["samples"]
    ]
    if not series:
        return None
    return charts.percent_lines(series, x_text=lambda x: dt.datetime.fromtimestamp(x, dt.UTC).strftime("%H:%M UTC"))


def _instant(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _session_of_page(view: dict[str, Any], row: Job) -> dict[str, Any] | None:
    record = db_session().get(JobSession, row.id)
    if record is None:
        return None
    shown = session_view(app_state().settings, row, record, utcnow())
    shown["open_url"] = url_for("web.open_session", job_id=row.id)
    return shown


@web_bp.get("/jobs/<job_id>/session/open")
def open_session(job_id: str) -> BaseResponse:
    """The Open button: a fresh single-use link, followed at once, so the link never sits in the page."""
    view = sessions_api.get_session(job_id).get_json()  # another account's job is the API's 404
    if view["link"] is None:
        raise NotFound(f"the session of job {view['job_id']} has ended")
    return redirect(view["link"], code=303)


@web_bp.get("/sessions/<label>/open")
def open_session_by_label(label: str) -> BaseResponse:
    """Where the proxy sends a browser without the session's cookie, once signed in here."""
    record = db_session().scalars(
        select(JobSession).join(Job, Job.id == JobSession.job_id).where(JobSession.label == label, Job.account == principal().account)
    ).one_or_none()
    if record is None:
        raise NotFound("no such session in your account")
    return open_session(record.job_id)


@web_data_bp.get("/jobs")
def jobs_data() -> Response:
    return job_listing.list_jobs()


@web_data_bp.get("/jobs/<job_id>")
def job_data(job_id: str) -> Response:
    return job_detail.get_job(job_id)


@web_data_bp.get("/jobs/<job_id>/logs")
def job_log_data(job_id: str) -> Response:
    return job_logs_api.job_logs(job_id)


# The job page's links: one output file (or a folder's listing), and the whole output folder as one tar.


@web_data_bp.get("/jobs/<job_id>/outputs/<storage_path:path>", merge_slashes=False)
def job_output_data(job_id: str, path: str) -> Response:
    return outputs_api.get_output(job_id, path)


@web_data_bp.get("/jobs/<job_id>/outputs.tar")
def job_outputs_tar(job_id: str) -> Response:
    return outputs_api.output_tar(job_id)


# -- submit -------------------------------------------------------------------


def _submit_page(
    template_name: str,
    *,
    entered: dict[str, str] | None,
    error: GpupoolError | None,
    quoted: dict[str, Any] | None = None,
    quoted_body: str | None = None,
) -> tuple[str, int]:
    app = app_state()
    template = app.templates.get(template_name)
    if template is None:
        raise NotFound(f"no template {template_name!r}")
    try:
        gpu_types = sorted(app.inventory.get().max_per_node_by_type)
    except ServiceUnavailable:
        gpu_types = []  # the form still works: the type is optional
    values = entered or {"gpus": str(template.default_gpus)}
    errors = error.details.get("errors", []) if error is not None else []
    return (
        render_template(
            "web/submit.html",
            templates=sorted(app.templates.values(), key=lambda t: t.name),
            template=template,
            fields=param_fields(template.parameter_schema(), entered),
            values={field: values.get(field, "") for field in RESOURCE_FIELDS},
            gpu_types=gpu_types,
            submission=values.get(_SUBMISSION_FIELD) or str(uuid.uuid4()),
            error=error,
            field_errors=errors,
            quote=quoted,
            quoted_body=quoted_body,
        ),
        status_for(error) if error is not None else 200,
    )


@web_bp.get("/submit")
def submit_form() -> tuple[str, int]:
    return _submit_page(request.args.get("template") or _first_template(), entered=None, error=None)


def _first_template() -> str:
    names = sorted(app_state().templates)
    if not names:
        raise NotFound("the operator has installed no templates")
    return "hello" if "hello" in names else names[0]


@web_bp.post("/submit")
def submit_job() -> BaseResponse | tuple[str, int]:
    """Two steps: the form's values are quoted (the API's dry run), and only a quoted body is submitted.

    Values changed after their quote are quoted again instead of submitted: the
    customer confirms the cost and start estimate of exactly what is sent.
    """
    template_name = request.form.get("template", "")
    template = app_state().templates.get(template_name)
    if template is None:
        raise NotFound(f"no template {template_name!r}")
    entered = request.form.to_dict()
    try:
        body = submit_body(template_name, template.parameter_schema(), entered)
        req = job_submitting.submit_request(body)
        fingerprint = request_fingerprint(body)
        if request.form.get("action") != "submit" or request.form.get(_QUOTED_FIELD) != fingerprint:
            found = job_submitting.quote_view(quote(app_state(), db_session(), principal(), req))
            return _submit_page(template_name, entered=entered, error=None, quoted=found, quoted_body=fingerprint)
        # The form's one-time key: a double click or a resent form submits the job once.
        key = entered.get(_SUBMISSION_FIELD) or None
        job, replayed, _secret = submit(app_state(), db_session(), principal(), req, body, key)
    except GpupoolError as exc:
        if status_for(exc) >= 500 and "job_id" not in exc.details:
            raise
        return _submit_page(template_name, entered=entered, error=exc)
    if not replayed:
        JOBS_SUBMITTED.labels(template=job.template).inc()
    return redirect(url_for("web.job", job_id=job.id), code=303)


# -- usage and invoices -------------------------------------------------------


def _account_in_view() -> str:
    """The caller's account, or for an admin the one named by ``?account=``: the API's rule."""
    caller = principal()
    wanted = request.args.get("account") or caller.account
    if (wanted != caller.account and not caller.is_admin) or db_session().get(Account, wanted) is None:
        raise NotFound(f"no account {wanted!r} visible to you")
    return wanted


def _hours_text(hours: float) -> str:
    return f"{hours:,.2f} h" if hours < 10 else f"{hours:,.1f} h"


def _money_meters(current: Balance, currency: str) -> list[charts.Meter]:
    """Spend against each budget the account has: this month's limit, and the prepaid credit."""
    budgets = (
        ("This month against the monthly limit", current.spent_period_nanos, current.monthly_limit_nanos),
        ("All spend against the prepaid credit", current.spent_total_nanos, current.prepaid_credit_nanos),
    )
    return [
        charts.meter(label, spent, limit, f"{format_nanos(spent)} {currency}", f"{format_nanos(limit)} {currency}")
        for label, spent, limit in budgets
        if limit is not None
    ]


@web_bp.get("/usage")
def usage_page() -> str:
    now = calendar_now()
    period = check_period(request.args.get("period") or period_of(now))
    account = _account_in_view()
    database = db_session()
    currency = app_state().settings.currency
    document = usage(database, account, period, currency, now)
    daily = gpu_seconds_by_day_and_type(database, account, period)
    year, month = int(period[:4]), int(period[5:])
    days = calendar.monthrange(year, month)[1]
    columns = [
        (f"{day:02d}", {gpu_type: seconds / 3600 for gpu_type, seconds in daily.get(dt.date(year, month, day), {}).items()})
        for day in range(1, days + 1)
    ]
    chart = charts.stacked_columns(columns, value_text=_hours_text, label_every=2)
    meters = _money_meters(balance(database, account, now), currency)
    return render_template(
        "web/usage.html",
        usage=document,
        chart=chart,
        meters=meters,
        gpu_hours=document["gpu_seconds"] / 3600,
        account=account,
        period=period,
        account_arg=account if account != principal().account else None,
    )


@web_bp.get("/invoices")
def invoices() -> str:
    account = _account_in_view()
    database = db_session()
    periods_query = union(
        select(LedgerEntry.period).where(LedgerEntry.account == account),
        select(Adjustment.period).where(Adjustment.account == account),
    )
    periods = set(database.scalars(select(periods_query.subquery().c.period))) | {period_of(calendar_now())}
    connection = database.connection()
    rows = []
    for period in sorted(periods, reverse=True):
        charges, adjustments, total = invoice_total_cents(connection, account, period)
        rows.append(
            {"period": period, "charges": format_cents(charges), "adjustments": format_cents(adjustments), "total": format_cents(total)}
        )
    return render_template(
        "web/invoices.html",
        rows=rows,
        account=account,
        currency=app_state().settings.currency,
        account_arg=account if account != principal().account else None,
    )


@web_bp.get("/invoices/<period>.csv")
def invoice_csv(period: str) -> Response:
    # The API's streamed CSV, with its own account rule and headers.
    return billing_api.get_invoice(period)
