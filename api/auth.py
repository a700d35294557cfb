"""Bearer-token authentication, run before the rate limiter so limits key on the token's subject."""

from __future__ import annotations

from flask import g, request

from api.context import state
from gpupool.errors import Unauthorized
from gpupool.tokens import verify_token

# /metrics is guarded by the caller's address instead (api.metrics).
PUBLIC_ENDPOINTS = frozenset({"meta.healthz", "meta.readyz", "meta.openapi", "metrics.metrics"})


def authenticate() -> None:
    if request.endpoint in PUBLIC_ENDPOINTS or request.endpoint is None:
        return
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("send a token as `Authorization: Bearer <token>`")
    g.principal = verify_token(state().settings, token.strip(), key=state().verification_key)


def rate_limit_key() -> str:
    caller = g.get("principal")
    return f"sub:{caller.sub}" if caller is not None else f"addr:{request.remote_addr}"
