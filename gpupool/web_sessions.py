"""Server-side sessions of the web pages: a random id in the cookie, its meaning in the database.

The cookie never carries the token pasted at sign-in, only a random id; the
database keeps that id's SHA-256 and the token's ``jti``. Every page reads the
token's record (subject, account, role, expiry, revocation, the account's
state) through the session, so signing out (the row deleted), revoking the
token or disabling the account ends the session on the next page, on every
worker, with no cache in between.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gpupool.config import Settings
from gpupool.members import membership_of
from gpupool.models.accounts import Account
from gpupool.models.tokens import IssuedToken
from gpupool.models.web_sessions import WebSession
from gpupool.tokens import Principal, TokenStanding

# 32 random bytes, URL-safe: 43 characters.
SESSION_ID_BYTES = 32
MAX_SESSION_ID_LENGTH = 64


def _id_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def start_web_session(db: Session, caller: Principal, now: dt.datetime) -> str:
    """Record a sign-in of the verified ``caller``; the new session's id, for the cookie (the caller commits)."""
    assert caller.expires_at is not None  # a verified token always has its exp
    # Sign-ins that ended by themselves are swept here rather than by a job of their own.
    db.execute(delete(WebSession).where(WebSession.expires_at <= now))
    session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
    db.add(
        WebSession(
            id_hash=_id_hash(session_id),
            jti=caller.jti,
            created_at=now,
            expires_at=dt.datetime.fromtimestamp(caller.expires_at, dt.UTC),
        )
    )
    return session_id


def read_web_session(db: Session, settings: Settings, session_id: str, now: dt.datetime) -> tuple[Principal, TokenStanding] | None:
    """Who a live session is and its token's standing, from the records alone; None when it ended or never was."""
    if not 0 < len(session_id) <= MAX_SESSION_ID_LENGTH:
        return None
    row = db.execute(
        select(WebSession.jti, IssuedToken, Account.disabled_at)
        .join(IssuedToken, IssuedToken.jti == WebSession.jti)
        .join(Account, Account.name == IssuedToken.account)
        .where(WebSession.id_hash == _id_hash(session_id), WebSession.expires_at > now, IssuedToken.expires_at > now)
    ).one_or_none()
    if row is None:
        return None
    token: IssuedToken = row.IssuedToken
    # Lowering GPUPOOL_JWT_MAX_TTL_S cuts off sessions of long-lived tokens too, as it does the tokens.
    if (token.expires_at - token.issued_at).total_seconds() > settings.jwt_max_ttl_s:
        return None
    expires_at = int(token.expires_at.timestamp())
    caller = Principal(sub=token.subject, account=token.account, role=token.role, jti=token.jti, expires_at=expires_at)
    standing = TokenStanding(
        account=token.account, subject=token.subject, role=token.role, expires_at=expires_at,
        revoked=token.revoked_at is not None, account_disabled=row.disabled_at is not None,
        membership=membership_of(db, token.account, token.subject),
    )
    return caller, standing


def end_web_session(db: Session, session_id: str) -> None:
    """Forget the session (the caller commits): its cookie is worth nothing from then on."""
    db.execute(delete(WebSession).where(WebSession.id_hash == _id_hash(session_id)))
