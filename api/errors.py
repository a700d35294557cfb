"""The one error body and the one mapping from gpupool's error tree to HTTP."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import limits.errors
import redis.exceptions
from flask import Flask, Response, jsonify
from sqlalchemy.exc import DBAPIError, OperationalError
from werkzeug.exceptions import HTTPException

from api.context import app_state
from gpupool import errors as e
from gpupool.db import is_failover_error

log = logging.getLogger("gpupool.api")

# Most specific first: the first class an error is an instance of decides.
STATUS_BY_ERROR: tuple[tuple[type[e.GpupoolError], int], ...] = (
    (e.UnknownFields, 400),
    (e.BadRequest, 400),
    (e.Unauthorized, 401),
    (e.PaymentRequired, 402),
    (e.Forbidden, 403),
    (e.NotFound, 404),
    (e.Conflict, 409),
    (e.LengthRequired, 411),
    (e.PayloadTooLarge, 413),
    (e.UnsupportedMediaType, 415),
    (e.ValidationFailed, 422),
    (e.StorageQuotaExceeded, 507),
    (e.ServiceUnavailable, 503),
    (e.MigrationRequired, 503),
    # Usage cannot be priced, so the service cannot sell it: an operator must act.
    (e.PriceMissing, 503),
    # The account's Unix identity is missing on this host: an operator must act.
    (e.TenantError, 503),
)
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    402: "payment_required",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    411: "length_required",
    413: "payload_too_large",
    415: "unsupported_media_type",
    416: "range_not_satisfiable",
    422: "validation_failed",
    429: "rate_limited",
    503: "service_unavailable",
    507: "insufficient_storage",
}
# Details safe to show a customer; stderr and argv stay in the log.
_PUBLIC_DETAILS = (
    "unknown", "valid", "errors", "job_id", "allowed", "remaining", "required", "currency",
    "limit", "in_use", "asked", "spent_this_month", "role", "offset", "quota_bytes", "stored_bytes", "available_bytes",
)


def error_response(status: int, code: str, message: str, **extra: Any) -> Response:
    body = {"error": code, "message": message, **extra}
    response = jsonify(body)
    response.status_code = status
    return response


def status_for(error: e.GpupoolError) -> int:
    return next((status for cls, status in STATUS_BY_ERROR if isinstance(error, cls)), 500)


def _retry_after_s() -> int:
    """Seconds until the breached window resets (asked of the store only on a 429)."""
    limit = app_state().limiter.current_limit
    if limit is None:
        return 1
    try:
        return max(1, math.ceil(limit.reset_at - time.time()))
    except (redis.exceptions.RedisError, limits.errors.StorageError):
        # Counted in memory while the store is gone (api.auth): a whole window is the safe answer.
        return max(1, limit.limit.get_expiry())


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(e.GpupoolError)
    def _gpupool_error(error: e.GpupoolError) -> Response:
        status = status_for(error)
        if status >= 500:
            log.warning("%s: %s %s", error.code, error.message, error.details)
        extra = {key: error.details[key] for key in _PUBLIC_DETAILS if key in error.details}
        response = error_response(status, error.code, error.message, **extra)
        if status == 503:
            response.headers["Retry-After"] = "5"
        return response

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> Response:
        status = error.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        message = error.description or error.name
        if status == 429:
            message = f"rate limit exceeded ({error.description}); retry later"
        response = error_response(status, code, message)
        if status == 429:
            response.headers["Retry-After"] = str(_retry_after_s())
        allow = error.get_response().headers.get("Allow")
        if allow:
            response.headers["Allow"] = allow
        return response

    @app.errorhandler(OperationalError)
    @app.errorhandler(DBAPIError)
    def _database_error(error: DBAPIError) -> Response:
        log.warning("database error: %s", error)
        if is_failover_error(error):
            # Gone, shutting down, or read-only (a failover under way): the next try may reach the new leader.
            response = error_response(503, "database_unavailable", "the database is not answering or not taking writes; retry shortly")
            response.headers["Retry-After"] = "5"
            return response
        return error_response(500, "internal_error", "unexpected database error")

    @app.errorhandler(redis.exceptions.RedisError)
    @app.errorhandler(limits.errors.StorageError)
    def _limiter_storage_error(error: Exception) -> Response:
        # Failing closed: with no way to count requests, none is let through.
        log.warning("rate-limit storage error: %s", error)
        response = error_response(
            503, "rate_limit_unavailable", "the rate-limit store is not answering; retry shortly"
        )
        response.headers["Retry-After"] = "5"
        return response

    @app.errorhandler(Exception)
    def _unexpected(error: Exception) -> Response:
        log.exception("unhandled error")
        return error_response(500, "internal_error", "an unexpected error occurred")
