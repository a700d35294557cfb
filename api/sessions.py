"""Interactive sessions: their state and single-use links, and the two endpoints gpupool's proxy calls.

``GET /jobs/<id>/session`` is an ordinary API call (bearer token). The proxy's
endpoints are not for browsers: nginx calls them with the shared
``session_proxy_key`` and the session's label from the request's host name,
passing the browser's cookie along. Without the key they are the 404 of an
address that does not exist. For a cookie that is not this session's (another
account's, expired, or no session at that name) the auth endpoint answers 403,
which nginx turns into the same 404 for all of them; without a cookie, 401,
which nginx turns into the sign-in redirect.
"""

from __future__ import annotations

import hmac

from flask import Blueprint, Response, current_app, jsonify, redirect, request
from werkzeug.wrappers import Response as BaseResponse

from api.caches import ExpiringCache
from api.context import app_state, db_session, principal
from api.jobs import _refresh_if_unfinished, _visible_job
from gpupool.db import utcnow
from gpupool.errors import NotFound
from gpupool.models import Job, JobSession
from gpupool.sessions import COOKIE_NAME, ENDED, Upstream, authorize, issue_link, note_ready, redeem_link, session_view

sessions_bp = Blueprint("sessions", __name__)
session_proxy_bp = Blueprint("session_proxy", __name__, url_prefix="/session-proxy")

LABEL_HEADER = "X-Gpupool-Session"
KEY_HEADER = "X-Gpupool-Proxy-Key"
_CACHE_KEY = "gpupool_session_auth"


def _session_of(job_id: str) -> tuple[Job, JobSession]:
    job = _visible_job(job_id)
    record = db_session().get(JobSession, job.id)
    if record is None:
        raise NotFound(f"job {job.id} is not a session (its template {job.template!r} is not a session template)")
    return job, record


@sessions_bp.get("/jobs/<job_id>/session")
def get_session(job_id: str) -> Response:
    job, record = _session_of(job_id)
    _refresh_if_unfinished(job)
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


def _auth_cache() -> ExpiringCache[tuple[str, str], Upstream | None]:
    cache = current_app.extensions.get(_CACHE_KEY)
    if cache is None:
        cache = current_app.extensions[_CACHE_KEY] = ExpiringCache(app_state().settings.session_auth_cache_s)
    return cache


@session_proxy_bp.get("/auth")
def proxy_auth() -> Response:
    label = _check_proxy()
    cookie = request.cookies.get(COOKIE_NAME)
    if not cookie:
        return Response(status=401)
    settings = app_state().settings

    def fetch(key: tuple[str, str]) -> Upstream | None:
        return authorize(db_session(), settings, key[0], key[1], utcnow())

    upstream = _auth_cache().get((label, cookie), fetch)
    if upstream is None:
        return Response(status=403)
    response = Response(status=204)
    response.headers["X-Gpupool-Upstream"] = upstream.address
    response.headers["X-Gpupool-Secret"] = upstream.secret
    response.headers["Cache-Control"] = "no-store"
    return response


@session_proxy_bp.get("/open")
def proxy_open() -> BaseResponse:
    label = _check_proxy()
    settings = app_state().settings
    cookie = redeem_link(db_session(), settings, label, request.args.get("link", ""), utcnow())
    if cookie is None:
        raise NotFound("this link has been used, has expired, or is not for this session; ask for a new one")
    response = redirect("/", code=303)
    # No Domain attribute: the cookie belongs to this session's origin alone, never its siblings or gpupool's.
    response.set_cookie(
        COOKIE_NAME,
        cookie,
        max_age=settings.session_cookie_ttl_s,
        path="/",
        httponly=True,
        secure=settings.sessions_url.startswith("https://"),
        samesite="Lax",
    )
    response.headers["Cache-Control"] = "no-store"
    return response
