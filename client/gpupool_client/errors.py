"""Errors the client raises, typed from the API's ``error`` codes.

    GpupoolError                  base; ``status``, ``code``, ``message``, ``body``
    ├── BadRequest                400 (malformed query, bad cursor, ...)
    ├── ValidationFailed          422, and 400 ``unknown_fields``; ``errors`` per field
    ├── Unauthorized              401
    ├── PaymentRequired           402; ``remaining``, ``required``, ``currency``
    ├── Forbidden                 403
    ├── NotFound                  404
    ├── Conflict                  409; ``job_id`` when the API names one
    ├── RateLimited               429; ``retry_after`` seconds
    ├── ServiceUnavailable        503 (Slurm, database, rate-limit store); ``retry_after``, ``job_id``
    ├── ConnectionFailed          no answer at all, after the retries
    ├── WaitTimeout               ``Job.wait(timeout=...)`` ran out (also a ``TimeoutError``)
    └── InvalidSignature          a webhook's ``Gpupool-Signature`` does not match
"""

from __future__ import annotations

from typing import Any


class GpupoolError(Exception):
    """Base of every client error. ``code`` is the API's stable machine-readable name."""

    def __init__(self, message: str, *, status: int | None = None, code: str = "client_error", body: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.body = body


class BadRequest(GpupoolError):
    pass


class ValidationFailed(GpupoolError):
    """``errors`` is a list of ``{"field": ..., "message": ...}``, one per offending field."""

    def __init__(self, message: str, *, errors: list[dict[str, str]], **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.errors = errors


class Unauthorized(GpupoolError):
    pass


class PaymentRequired(GpupoolError):
    """Amounts are decimal strings in ``currency``; ``required`` is None when nothing at all is left."""

    def __init__(self, message: str, *, remaining: str | None, required: str | None, currency: str | None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.remaining = remaining
        self.required = required
        self.currency = currency


class Forbidden(GpupoolError):
    pass


class NotFound(GpupoolError):
    pass


class Conflict(GpupoolError):
    def __init__(self, message: str, *, job_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.job_id = job_id


class StorageQuotaExceeded(GpupoolError):
    """507: the account's storage is full; ``stored_bytes`` and ``available_bytes`` say how full."""


class RateLimited(GpupoolError):
    def __init__(self, message: str, *, retry_after: float, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ServiceUnavailable(GpupoolError):
    """``job_id`` is set when a submit may still have reached Slurm: retry with the same key."""

    def __init__(self, message: str, *, retry_after: float | None = None, job_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after
        self.job_id = job_id


class ConnectionFailed(GpupoolError):
    pass


class WaitTimeout(GpupoolError, TimeoutError):
    pass


class InvalidSignature(GpupoolError):
    pass


def retry_after_s(headers: Any) -> float | None:
    """Retry-After in seconds (the API sends whole seconds; an HTTP date is not used)."""
    raw = headers.get("Retry-After")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None


def error_from_response(status: int, headers: Any, body: Any) -> GpupoolError:
    """The typed error for a non-2xx answer; ``body`` is the parsed JSON or the raw text."""
    fields = body if isinstance(body, dict) else {}
    code = str(fields.get("error") or "http_error")
    message = str(fields.get("message") or f"HTTP {status}")
    common: dict[str, Any] = {"status": status, "code": code, "body": body}
    if code == "unknown_fields":
        unknown = fields.get("unknown") or []
        return ValidationFailed(message, errors=[{"field": name, "message": "unknown field"} for name in unknown], **common)
    if status == 400:
        return BadRequest(message, **common)
    if status == 401:
        return Unauthorized(message, **common)
    if status == 402:
        return PaymentRequired(
            message, remaining=fields.get("remaining"), required=fields.get("required"), currency=fields.get("currency"), **common
        )
    if status == 403:
        return Forbidden(message, **common)
    if status == 404:
        return NotFound(message, **common)
    if status == 409:
        return Conflict(message, job_id=fields.get("job_id"), **common)
    if status == 422:
        errors = fields.get("errors") or [{"field": "", "message": message}]
        return ValidationFailed(message, errors=errors, **common)
    if status == 507:
        return StorageQuotaExceeded(message, **common)
    if status == 429:
        return RateLimited(message, retry_after=retry_after_s(headers) or 1.0, **common)
    if status == 503:
        return ServiceUnavailable(message, retry_after=retry_after_s(headers), job_id=fields.get("job_id"), **common)
    return GpupoolError(message, **common)
