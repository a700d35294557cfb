"""The pages' session cookie and CSRF tokens.

The cookie holds a random server-side session id and the CSRF value, never
the pasted token; it is signed (not encrypted) by Flask with a key of its own:
``web_session_secret``, or an HMAC of the JWT secret under a fixed label, so
the cookie key never equals the JWT key and one cannot stand in for the other.
It is HttpOnly, SameSite=Strict, Secure when the request came over TLS
(gunicorn trusts X-Forwarded-Proto from the local proxy only), scoped to /ui,
and expires with the token. Every request reads the session's row and its
token's record (``gpupool.web_sessions``); signing out deletes the row.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets

from flask import Flask, request, session
from flask.sessions import SecureCookieSessionInterface, SessionMixin

from api.auth import PAGE_SESSION_KEY
from gpupool.config import Settings
from gpupool.errors import Forbidden

COOKIE_NAME = "gpupool_session"
COOKIE_PATH = "/ui"
CSRF_KEY = "csrf"
CSRF_FIELD = "csrf_token"
# The pages' scripts send the same value in this header on their writes (a form sends it as CSRF_FIELD).
CSRF_HEADER = "X-CSRF-Token"
EXPIRES_KEY = "expires_at"
_SECRET_LABEL = b"gpupool web session cookie v1"


def session_secret(settings: Settings) -> str | None:
    """The cookie signing key, or None when none can be had (RS256 without web_session_secret)."""
    if settings.web_session_secret:
        return settings.web_session_secret
    if settings.jwt_algorithm == "HS256" and settings.jwt_secret:
        return hmac.new(settings.jwt_secret.encode(), _SECRET_LABEL, hashlib.sha256).hexdigest()
    return None


class PageSessionInterface(SecureCookieSessionInterface):
    """Flask's signed cookie, Secure only over TLS and expiring when the token inside does."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return request.is_secure

    def get_expiration_time(self, app: Flask, session: SessionMixin) -> dt.datetime | None:
        expires = session.get(EXPIRES_KEY)
        # No token yet (the sign-in form's CSRF value): a cookie that ends with the browser session.
        return dt.datetime.fromtimestamp(expires, dt.UTC) if isinstance(expires, int) else None


def configure_sessions(app: Flask, settings: Settings) -> None:
    secret = session_secret(settings)
    app.config.update(
        SECRET_KEY=secret,
        SESSION_COOKIE_NAME=COOKIE_NAME,
        SESSION_COOKIE_PATH=COOKIE_PATH,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        # Flask refuses signatures older than this; the token's own expiry is checked on every request.
        PERMANENT_SESSION_LIFETIME=dt.timedelta(seconds=settings.jwt_max_ttl_s),
    )
    app.session_interface = PageSessionInterface()


def csrf_token() -> str:
    """This session's CSRF value, made on first use; every form carries it in a hidden field."""
    value = session.get(CSRF_KEY)
    if not isinstance(value, str):
        value = session[CSRF_KEY] = secrets.token_urlsafe(32)
    return value


def check_csrf(*, header: bool = False) -> None:
    """The form's hidden field (or, with ``header``, the script's header) against the session's value."""
    sent = request.headers.get(CSRF_HEADER, "") if header else request.form.get(CSRF_FIELD, "")
    expected = session.get(CSRF_KEY)
    if not isinstance(expected, str) or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise Forbidden(
            "this form is out of date or was not sent from this site; reload the page and try again",
            code="csrf_failed",
        )


def start_session(session_id: str, expires_at: int) -> None:
    """The cookie of a fresh server-side session: nothing from before sign-in (its CSRF value included) survives."""
    session.clear()
    session[PAGE_SESSION_KEY] = session_id
    session[EXPIRES_KEY] = expires_at
    session[CSRF_KEY] = secrets.token_urlsafe(32)
