"""Interactive sessions: their state and single-use links, and the two endpoints gpupool's proxy calls.

``GET /jobs/<id>/session`` is an ordinary API call (bearer token). The proxy's
endpoints are not for browsers: nginx calls them with the shared
``session_proxy_key`` and the session's label from the request's host name,
passing the browser's cookie along. Without the key they are the 404 of an
address that does not exist. For a cookie that is not this session's (another
account's, expired, or no session at that name) the auth endpoint answers 403,
which nginx turns into the same 404 for all of them; without a cookie, 401,
which nginx turns into the sign-in redirect. A cookie gpupool did not make for
this session (its MAC, ``gpupool.sessions.grant_value_signed``) is refused
before the cache and the database: a flood of made-up cookies costs a hash each.
"""

from __future__ import annotations

import hmac

from flask import Blueprint, Response, jsonify, request

from api.context import app_state, db_session, principal
from api.jobs.lookup import JOB_ID_PARAM, refresh_if_unfinished, visible_job
from api.routing import Reply, operation
from api.schemas import SessionOut
from gpupool.config import Settings
from gpupool.db import utcnow
from gpupool.errors import NotFound
from gpupool.members import WRITERS
from gpupool.models import Job, JobSession
from gpupool.models.sessions import COOKIE
from gpupool.sessions import (
    ENDED,
    Upstream,
    authorize,
    grant_cookie_name,
    grant_value_signed,
    issue_link,
    note_ready,
    redeem_link,
    session_view,
)

sessions_bp = Blueprint("sessions", __name__)
session_proxy_bp = Blueprint("session_proxy", __name__, url_prefix="/session-proxy")

LABEL_HEADER = "X-Gpupool-Session"
KEY_HEADER = "X-Gpupool-Proxy-Key"
# What /.gpupool/open answers with the cookie: a page of the session's own origin that goes on to /. A redirect
# would not do: the browser arrived from gpupool's site, and it sends a SameSite=Strict cookie on no request
# of a navigation that began on another site, the redirected one included; this page's own navigation is same-origin.
OPEN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="0; url=/">
<title>Opening your session</title></head>
<body><p>Opening your session&hellip; <a href="/">Continue</a></p></body></html>
"""


def _session_of(job_id: str) -> tuple[Job, JobSession]:
    job = visible_job(job_id)
    record = db_session().get(JobSession, job.id)
    if record is None:
        raise NotFound(f"job {job.id} is not a session (its template {job.template!r} is not a session template)")
    return job, record


@operation(
    sessions_bp, "GET", "/jobs/<job_id>/session", roles=WRITERS,
    summary="A session job's state and a single-use link that opens it in a browser",
    parameters=[JOB_ID_PARAM], replies={"200": Reply("The session", SessionOut)}, errors=(404,),
)
def get_session(job_id: str) -> Response:
    job, record = _session_of(job_id)
    refresh_if_unfinished(job)
    session = db_session()
    settings = app_state().settings
    now = utcnow()
    note_ready(session, settings, job, record, now)
    view = session_view(settings, job, record, now)
    view["link"], view["link_expires_in_s"] = None, None
    caller = principal()
    # Only the account's own callers get a link: the cookie it sets opens the tenant's app. Not an
    # API key's: a session runs whatever its user types, more than a read or submit scope grants,
    # and a link stands only while the operator-issued token it was made for stands.
    if view["state"] != ENDED and caller.account == job.account and caller.scope is None:
        view["link"] = issue_link(session, settings, record, caller, now)
        view["link_expires_in_s"] = settings.session_link_ttl_s
    session.commit()
    return jsonify(view)


def _check_proxy() -> str:
    """The session label nginx names, when the caller is nginx; otherwise the 404 of no such address."""
    key = app_state().settings.session_proxy_key
    sent = request.headers.get(KEY_HEADER, "")
    if not key or not hmac.compare_digest(sent.encode(), key.encode()):
        raise NotFound("no such address")
    return request.headers.get(LABEL_HEADER, "").lower()


def _answer(status: int, settings: Settings, upstream: Upstream | None = None) -> Response:
    """The auth answer, with how long nginx may keep it: it caches answers, refusals included, for
    ``session_auth_cache_s`` (X-Accel-Expires, one cache shared by its workers), so a session's many
    requests and a flood of one made-up cookie ask the database once per that time, and a revoked token
    or an ended session is refused within it."""
    response = Response(status=status)
    if upstream is not None:
        response.headers["X-Gpupool-Upstream"] = upstream.address
        response.headers["X-Gpupool-Secret"] = upstream.secret
    response.headers["X-Accel-Expires"] = str(int(settings.session_auth_cache_s))
    response.headers["Cache-Control"] = "no-store"
    return response


@session_proxy_bp.get("/auth")
def proxy_auth() -> Response:
    label = _check_proxy()
    settings = app_state().settings
    cookies = request.cookies.getlist(grant_cookie_name(settings))
    if not cookies or not cookies[0]:
        return Response(status=401)
    cookie = cookies[0]
    # Two (nginx refuses those first, with a 400 that says so) or one gpupool never made for this
    # session: refused on the MAC alone, before the database.
    if len(cookies) > 1 or not grant_value_signed(settings, COOKIE, label, cookie):
        return _answer(403, settings)
    upstream = authorize(db_session(), settings, label, cookie, utcnow())
    return _answer(403, settings) if upstream is None else _answer(204, settings, upstream)


@session_proxy_bp.get("/open")
def proxy_open() -> Response:
    label = _check_proxy()
    settings = app_state().settings
    cookie = redeem_link(db_session(), settings, label, request.args.get("link", ""), utcnow())
    if cookie is None:
        raise NotFound("this link has been used, has expired, or is not for this session; ask for a new one")
    response = Response(OPEN_PAGE, status=200, mimetype="text/html")
    # No Domain attribute: the cookie belongs to this session's origin alone, never its siblings or gpupool's.
    # Strict: no request another site starts carries it, a sibling session's page (same site) included.
    response.set_cookie(
        grant_cookie_name(settings),
        cookie,
        max_age=settings.session_cookie_ttl_s,
        path="/",
        httponly=True,
        secure=settings.sessions_url.startswith("https://"),
        samesite="Strict",
    )
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Content-Security-Policy"] = "default-src 'none'"
    return response
