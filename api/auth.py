"""Bearer-token authentication, run before the rate limiter so limits key on the token's account and subject."""

from __future__ import annotations

import logging
import time

from flask import g, request, session
from flask_limiter import RequestLimit
from limits.errors import StorageError
from redis.exceptions import RedisError
from werkzeug.exceptions import TooManyRequests

from api.context import app_state, db_session
from api.routing import Public, access_of
from gpupool.api_keys import is_api_key, principal_for_key, require_scope
from gpupool.db import utcnow
from gpupool.errors import Forbidden, Unauthorized
from gpupool.members import require_role
from gpupool.tokens import (
    Principal,
    TokenStanding,
    read_standing,
    require_good_standing,
    verify_token,
    with_membership,
)
from gpupool.web_sessions import read_web_session

# The API's routes that take no token are declared so (api.routing.PUBLIC): health, the
# document, and /metrics, which is guarded by the caller's address instead (api.metrics).
# "/" redirects to the pages; their stylesheet and scripts hold nothing private.
PUBLIC_PAGE_ENDPOINTS = frozenset({"web_root", "web.static"})
# The web pages (api.web) authenticate with their session cookie, never a header; the
# cookie holds only a server-side session's id (gpupool.web_sessions), never the token.
PAGE_BLUEPRINTS = frozenset({"web", "web_data"})
PAGE_SESSION_KEY = "sid"
# The reverse proxy's endpoints (api.sessions) check the proxy's own key instead.
PROXY_BLUEPRINTS = frozenset({"session_proxy"})
# The endpoints that run a template: a template-limited API key is checked on these, and only
# these have their body read here (tests/api/test_api_keys.py asserts they are the ones that submit).
TEMPLATE_ENDPOINTS = frozenset({"submit.submit_job", "submit.quote_job"})

log = logging.getLogger("gpupool.api")


def authenticate() -> None:
    if request.endpoint is None or request.endpoint in PUBLIC_PAGE_ENDPOINTS or request.blueprint in PROXY_BLUEPRINTS:
        return
    if request.blueprint in PAGE_BLUEPRINTS:
        # Pages decide themselves what a visitor without a session sees (the sign-in page).
        g.principal = _page_principal()
        return
    access = access_of(request.endpoint)
    if isinstance(access, Public):
        return
    try:
        _authenticate(access)
    except Unauthorized:
        # The limiter's own check runs after this hook and never sees a refused
        # request: count those here, per address, so guessing tokens is throttled too.
        count_unauthenticated()
        raise


def _page_principal() -> Principal | None:
    """The caller behind the session cookie, read from the database's records; None to sign in again."""
    session_id = session.get(PAGE_SESSION_KEY)
    if not isinstance(session_id, str):
        return None
    # No cache: a sign-out, a revocation or a disabled account ends the session on the next page, on every worker.
    found = read_web_session(db_session(), app_state().settings, session_id, utcnow())
    try:
        if found is None:
            raise Unauthorized("the session has ended", code="session_ended")
        caller, standing = found
        require_good_standing(caller, standing)
        return with_membership(caller, standing.membership)
    except (Unauthorized, Forbidden):
        # Signed out, expired, revoked, its account disabled or its subject taken out of the
        # account's members: the cookie is worth nothing any more.
        session.clear()
        return None


def count_unauthenticated() -> None:
    state = app_state()
    limiter, limit = state.limiter, state.unauthenticated_limit
    args = ["gpupool", "unauthenticated", f"addr:{request.remote_addr}"]
    try:
        # flask-limiter's strategy: the in-memory one once it has found the store gone.
        hit = limiter.limiter.hit(limit, *args)
    except (RedisError, StorageError):
        # This hook runs before the limiter's own check, which is what notices a store gone:
        # count in this process's memory meanwhile, as the limiter then does (api.__init__).
        log.warning("rate-limit store not answering: refused tokens counted in this process")
        hit = state.unauthenticated_fallback.hit(limit, *args)
    if not hit:
        # api.errors reads Retry-After off the request's current limit.
        limiter.context.view_rate_limit = RequestLimit(limiter, limit, args, True, False)
        raise TooManyRequests(str(limit))


def _authenticate(roles: frozenset[str]) -> None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("send a token as `Authorization: Bearer <token>`")
    token = token.strip()
    if is_api_key(token):
        # Keys are checked against their row on every request: a revocation or expiry shows at once.
        g.principal = principal_for_key(db_session(), token, utcnow())
        # Only where a key's templates matter: elsewhere the body may be a large upload, never read whole.
        takes_template = request.endpoint in TEMPLATE_ENDPOINTS
        body = request.get_json(silent=True) if request.is_json and takes_template else None
        require_scope(g.principal, request.method, takes_template, body.get("template") if isinstance(body, dict) else None)
    else:
        g.principal = principal_for_token(token)
    caller: Principal = g.principal
    if caller.membership is not None:
        require_role(caller.membership, roles)


def principal_for_token(token: str) -> Principal:
    """The caller behind ``token``: signature, claims and standing, or Unauthorized saying why not."""
    # A token's signature and claims cannot change: one verification is reused for
    # token_check_cache_s (only tokens that verified are kept), but never past its expiry.
    caller = app_state().verified_tokens.get(token, _verify)
    if caller.expires_at is not None and caller.expires_at <= time.time():
        caller = _verify(token)  # raises token_expired
    # Cached per worker for token_check_cache_s: a revocation or a disabled account
    # takes effect within that many seconds, at one query per token per interval.
    standing = app_state().token_standings.get(caller.jti, _standing_from_database)
    require_good_standing(caller, standing)
    assert standing is not None
    return with_membership(caller, standing.membership)


def _verify(token: str) -> Principal:
    return verify_token(app_state().settings, token, key=app_state().verification_key)


def _standing_from_database(jti: str) -> TokenStanding | None:
    return read_standing(db_session(), jti)


def rate_limit_key() -> str:
    caller = g.get("principal")
    if caller is None:
        return f"addr:{request.remote_addr}"
    # Subjects are names a token issuer chose, not unique across accounts; account
    # names hold no ':', so this key is unambiguous.
    return f"acct:{caller.account}:sub:{caller.sub}"
