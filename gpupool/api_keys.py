"""API keys: ``gpk_<id>_<secret>``, made by customers, stored as the secret's SHA-256.

The secret is 32 random bytes, so a plain SHA-256 is enough (no password
stretching needed); the row is found by its id and the hashes compared in
constant time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.errors import Forbidden, NotFound, Unauthorized, ValidationFailed
from gpupool.members import KEY_SCOPES_BY_ROLE, membership_of, require_member
from gpupool.models.accounts import Account
from gpupool.models.api_keys import ApiKey
from gpupool.tokens import Principal

PREFIX = "gpk_"
SCOPES = ("read", "submit", "admin")
MAX_NAME_LENGTH = 64
# last_used_at is written at most this often per key, not on every request.
LAST_USED_RESOLUTION = dt.timedelta(seconds=60)


@dataclass(frozen=True)
class NewKey:
    row: ApiKey
    secret: str  # the whole bearer value, shown once


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def is_api_key(token: str) -> bool:
    return token.startswith(PREFIX)


def require_key_manager(caller: Principal) -> None:
    """Forbidden unless the caller may create, list and revoke its account's keys."""
    if caller.scope is not None and caller.scope != "admin":
        raise Forbidden(f"a key with scope {caller.scope!r} cannot manage keys", code="scope_insufficient")


def create_key(
    session: Session, settings: Settings, caller: Principal, *, name: str, scope: str,
    days: int | None, templates: list[str] | None, known_templates: set[str], now: dt.datetime,
) -> NewKey:
    """A new key for the caller's account, added to ``session`` (the caller commits)."""
    require_key_manager(caller)
    if not 0 < len(name) <= MAX_NAME_LENGTH:
        raise ValidationFailed(f"name must be 1 to {MAX_NAME_LENGTH} characters")
    if scope not in SCOPES:
        raise ValidationFailed(f"scope must be one of {', '.join(SCOPES)}")
    if caller.membership is not None and scope not in KEY_SCOPES_BY_ROLE[caller.membership.role]:
        raise Forbidden(
            f"a {caller.membership.role} of the account may make keys of scope "
            f"{', '.join(sorted(KEY_SCOPES_BY_ROLE[caller.membership.role]))} only",
            code="scope_insufficient",
        )
    lifetime = settings.api_key_max_days if days is None else days
    if not 0 < lifetime <= settings.api_key_max_days:
        raise ValidationFailed(f"expires_in_days must be 1 to {settings.api_key_max_days}")
    if templates is not None:
        unknown = sorted(set(templates) - known_templates)
        if unknown or not templates:
            raise ValidationFailed(f"templates must be a non-empty list of known templates; unknown: {unknown}")
        if caller.templates is not None and not set(templates) <= set(caller.templates):
            raise Forbidden("a key cannot allow templates its creator may not submit", code="scope_insufficient")
    elif caller.templates is not None:
        templates = list(caller.templates)
    key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    row = ApiKey(
        id=key_id, account=caller.account, name=name, scope=scope, templates=templates,
        secret_sha256=_digest(secret), created_by=caller.sub, created_at=now,
        expires_at=now + dt.timedelta(days=lifetime),
    )
    session.add(row)
    return NewKey(row=row, secret=f"{PREFIX}{key_id}_{secret}")


def _manages_all_keys(caller: Principal) -> bool:
    return caller.is_admin or (caller.membership is not None and caller.membership.role == "admin")


def list_keys(session: Session, caller: Principal) -> list[ApiKey]:
    """The account's keys for its admins; a member's or viewer's own keys for them."""
    query = select(ApiKey).where(ApiKey.account == caller.account)
    if not _manages_all_keys(caller):
        query = query.where(ApiKey.created_by == caller.sub)
    return list(session.scalars(query.order_by(ApiKey.created_at, ApiKey.id)))


def revoke_key(session: Session, caller: Principal, key_id: str, now: dt.datetime) -> ApiKey:
    """Revoke one of the caller's account's keys (at once: every request reads its row); the row."""
    row = session.get(ApiKey, key_id)
    # Another account's key (or, for a member, another member's) reads as absent: ids are not for guessing.
    if row is None or row.account != caller.account or not (_manages_all_keys(caller) or row.created_by == caller.sub):
        raise NotFound(f"no key {key_id!r} in this account")
    if row.revoked_at is None:
        row.revoked_at = now
    return row


def key_details(row: ApiKey) -> dict[str, Any]:
    """What the audit log keeps of a new key: what it may do and until when, never its secret."""
    return {"name": row.name, "scope": row.scope, "templates": row.templates, "expires_at": utc_text(row.expires_at)}


def principal_for_key(session: Session, token: str, now: dt.datetime) -> Principal:
    """The caller behind an API key, read from its row on every request, or Unauthorized saying why not."""
    key_id, _, secret = token.removeprefix(PREFIX).partition("_")
    row = session.get(ApiKey, key_id) if key_id and secret else None
    if row is None or not hmac.compare_digest(row.secret_sha256, _digest(secret)):
        raise Unauthorized("the API key is not valid", code="key_unknown")
    if row.revoked_at is not None:
        raise Unauthorized("the API key has been revoked", code="key_revoked")
    if row.expires_at <= now:
        raise Unauthorized("the API key has expired", code="key_expired")
    holder = session.get(Account, row.account)
    if holder is None or holder.disabled_at is not None:
        raise Unauthorized(f"the account {row.account} is disabled", code="account_disabled")
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_RESOLUTION:
        row.last_used_at = now
        session.commit()
    # A key acts as the member who made it, with that member's role and limits as they are now.
    return Principal(
        sub=row.created_by, account=row.account, role="customer", jti=f"key:{row.id}",
        expires_at=int(row.expires_at.timestamp()), scope=row.scope,
        templates=tuple(row.templates) if row.templates is not None else None,
        membership=require_member(membership_of(session, row.account, row.created_by), row.account),
    )


def require_scope(caller: Principal, method: str, takes_template: bool, template: object) -> None:
    """Forbidden when a key asks for more than its scope or its templates allow.

    ``takes_template``: the request is one that runs a template (the API knows which), ``template`` its name.
    """
    if caller.scope is None:
        return
    if caller.scope == "read" and method not in ("GET", "HEAD", "OPTIONS"):
        raise Forbidden("a key with scope 'read' cannot change anything", code="scope_insufficient")
    if caller.templates is not None and takes_template:
        if template not in caller.templates:
            raise Forbidden(f"this key may submit only {', '.join(caller.templates)}", code="template_not_allowed")
