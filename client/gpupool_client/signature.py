"""Webhook signatures: ``Gpupool-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">``."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

from gpupool_client.errors import InvalidSignature

SIGNATURE_HEADER = "Gpupool-Signature"


def compute_signature(payload: bytes, timestamp: int, secret: str) -> str:
    signed = str(timestamp).encode() + b"." + payload
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def verify_signature(
    payload: bytes | str, header: str, secret: str, tolerance_s: float = 300, *, now: float | None = None
) -> dict[str, Any]:
    """Check a webhook delivery and return its event; raise ``InvalidSignature`` otherwise.

    ``payload`` must be the request body exactly as received (not re-serialized JSON).
    The timestamp must be within ``tolerance_s`` of now, so a captured delivery
    cannot be replayed later; deduplicate retries by the event's ``id``.
    Several ``v1=`` values are accepted, for when the endpoint's secret is rotated.
    """
    body = payload.encode() if isinstance(payload, str) else payload
    timestamp: int | None = None
    candidates: list[str] = []
    for part in (header or "").split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1" and value:
            candidates.append(value)
    if timestamp is None or not candidates:
        raise InvalidSignature(f"malformed {SIGNATURE_HEADER} header", code="invalid_signature")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise InvalidSignature(f"signature timestamp is more than {tolerance_s:g} s away from now", code="invalid_signature")
    expected = compute_signature(body, timestamp, secret)
    if not any(hmac.compare_digest(expected, candidate) for candidate in candidates):
        raise InvalidSignature("signature does not match the payload", code="invalid_signature")
    try:
        event = json.loads(body)
    except ValueError as exc:
        raise InvalidSignature("the signed payload is not JSON", code="invalid_signature") from exc
    return event
