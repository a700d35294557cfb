"""JWT bearer tokens: issued by ``gpupool token create``, verified by the API.

Verification pins the algorithm from settings (never from the token header),
so ``alg: none`` and HS/RS confusion are refused, and it requires ``exp``,
``iat``, ``sub``, ``aud`` and ``jti``.

A signature is not enough: the API also asks the database about the token's
``jti`` (``read_standing``). Only tokens recorded by ``issue_token`` are
accepted, only when their account, subject, role and expiry are the ones
recorded for that ``jti``, and only while neither the token is revoked nor its
account disabled.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Required, TypedDict, Unpack

import jwt
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.clock import system_clock
from gpupool.config import Settings
from gpupool.errors import ConfigError, Conflict, NotFound, Unauthorized
from gpupool.members import Membership, membership_of, require_member
from gpupool.models.accounts import ACCOUNT_NAME, Account
from gpupool.models.tokens import JTI_LENGTH, IssuedToken

ROLES = ("customer", "admin")
MAX_SUBJECT_LENGTH = 255  # the width of jobs.owner
REQUIRED_CLAIMS = ("exp", "iat", "sub", "aud", "jti")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's subject, its account and role, and the token's id."""

    sub: str
    account: str
    role: str
    jti: str
    # The token's ``exp`` (Unix seconds), for whoever reuses a verification: not part of who calls.
    expires_at: int | None = field(default=None, compare=False)
    # Set for API keys (gpupool.api_keys): what the key may do, and the templates it may submit (None: any).
    scope: str | None = field(default=None, compare=False)
    templates: tuple[str, ...] | None = field(default=None, compare=False)
    # The caller's role and limits inside its account (gpupool.members); None for operators,
    # and for a caller not yet checked, who then sees only its own jobs.
    membership: Membership | None = field(default=None, compare=False)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def sees_whole_account(self) -> bool:
        """True when the caller may see every job of its account, not only its own."""
        return self.is_admin or (self.membership is not None and self.membership.sees_whole_account)


def with_membership(caller: Principal, membership: Membership | None) -> Principal:
    """The caller with its place in its account, or Forbidden when the account lists members and not it."""
    if caller.is_admin:
        return caller
    return replace(caller, membership=require_member(membership, caller.account))


def _read_key(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the JWT {what} key {path}: {exc.strerror}") from exc


def verification_key(settings: Settings) -> str:
    if settings.jwt_algorithm == "RS256":
        if not settings.jwt_public_key_file:
            raise ConfigError("jwt_algorithm is RS256 but GPUPOOL_JWT_PUBLIC_KEY_FILE is not set")
        return _read_key(settings.jwt_public_key_file, "public")
    if len(settings.jwt_secret) < 32:
        raise ConfigError("GPUPOOL_JWT_SECRET must be set to at least 32 characters")
    return settings.jwt_secret


def signing_key(settings: Settings) -> str:
    if settings.jwt_algorithm == "RS256":
        if not settings.jwt_private_key_file:
            raise ConfigError("jwt_algorithm is RS256 but GPUPOOL_JWT_PRIVATE_KEY_FILE is not set")
        return _read_key(settings.jwt_private_key_file, "private")
    return verification_key(settings)


@dataclass(frozen=True)
class TokenClaims:
    """What a new token says, before it is signed."""

    jti: str
    sub: str
    account: str
    role: str
    issued_at: dt.datetime
    expires_at: dt.datetime


class ClaimsAsked(TypedDict, total=False):
    """What a caller asks of a new token (``new_claims``, ``create_token``, ``issue_token`` all take these)."""

    sub: Required[str]
    account: Required[str]
    role: str  # default "customer"
    ttl_s: int | None  # default: settings.jwt_default_ttl_s
    now: dt.datetime | None  # default: the system clock


def new_claims(settings: Settings, **asked: Unpack[ClaimsAsked]) -> TokenClaims:
    """Claims for a new token with a fresh ``jti``, or ConfigError saying which argument is wrong."""
    sub, account, role = asked["sub"], asked["account"], asked.get("role", "customer")
    ttl_s, now = asked.get("ttl_s"), asked.get("now")
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}")
    if not 0 < len(sub) <= MAX_SUBJECT_LENGTH or not ACCOUNT_NAME.match(account):
        raise ConfigError(f"a token needs a user of 1 to {MAX_SUBJECT_LENGTH} characters and a valid account name")
    lifetime = settings.jwt_default_ttl_s if ttl_s is None else ttl_s
    if lifetime <= 0:
        raise ConfigError("--ttl must be a positive number of seconds")
    if lifetime > settings.jwt_max_ttl_s:
        raise ConfigError(
            f"--ttl {lifetime} is longer than the ceiling of {settings.jwt_max_ttl_s} seconds (GPUPOOL_JWT_MAX_TTL_S)"
        )
    # JWT times are whole seconds; the recorded times match the claims exactly.
    issued = (now or system_clock()).astimezone(dt.UTC).replace(microsecond=0)
    return TokenClaims(
        jti=uuid.uuid4().hex,
        sub=sub,
        account=account,
        role=role,
        issued_at=issued,
        expires_at=issued + dt.timedelta(seconds=lifetime),
    )


def sign_claims(settings: Settings, claims: TokenClaims) -> str:
    payload: dict[str, Any] = {
        "sub": claims.sub,
        "account": claims.account,
        "role": claims.role,
        "iat": int(claims.issued_at.timestamp()),
        "exp": int(claims.expires_at.timestamp()),
        "aud": settings.jwt_audience,
        "jti": claims.jti,
    }
    return jwt.encode(payload, signing_key(settings), algorithm=settings.jwt_algorithm)


def create_token(settings: Settings, **asked: Unpack[ClaimsAsked]) -> str:
    """A signed token that is not recorded anywhere, so the API refuses it; ``issue_token`` records one."""
    return sign_claims(settings, new_claims(settings, **asked))


def issue_token(session: Session, settings: Settings, **asked: Unpack[ClaimsAsked]) -> str:
    """Sign a token for an existing, enabled account and add its row to ``session`` (the caller commits)."""
    claims = new_claims(settings, **asked)
    token = sign_claims(settings, claims)
    account = claims.account
    holder = session.get(Account, account)
    if holder is None:
        raise NotFound(f"no account {account!r}; create it with `gpupool account create {account}`")
    if holder.disabled_at is not None:
        raise Conflict(f"account {account!r} is disabled; `gpupool account enable {account}` first")
    session.add(
        IssuedToken(
            jti=claims.jti,
            account=account,
            subject=claims.sub,
            role=claims.role,
            issued_at=claims.issued_at,
            expires_at=claims.expires_at,
        )
    )
    return token


def revoke_token(session: Session, jti: str, *, by: str, reason: str | None, now: dt.datetime) -> tuple[IssuedToken, bool]:
    """Mark a token revoked; the row, and whether this call revoked it (False: it already was)."""
    token = session.get(IssuedToken, jti)
    if token is None:
        raise NotFound(f"no token with id {jti!r}; `gpupool token list --account ACCOUNT` shows them")
    if token.revoked_at is not None:
        return token, False
    token.revoked_at, token.revoked_by, token.revoke_reason = now, by, reason
    return token, True


@dataclass(frozen=True)
class TokenStanding:
    """What the database recorded about one token when it was issued, and whether it may still be used."""

    account: str
    subject: str
    role: str
    expires_at: int  # Unix seconds, as the token's ``exp`` claim
    revoked: bool
    account_disabled: bool
    # The subject's place in the account, read with the record (gpupool.members.membership_of).
    membership: Membership | None = None


def read_standing(session: Session, jti: str) -> TokenStanding | None:
    """The token's record and standing in one query, or None when no token with that id was issued here."""
    row = session.execute(
        select(
            IssuedToken.account, IssuedToken.subject, IssuedToken.role, IssuedToken.expires_at,
            IssuedToken.revoked_at, Account.disabled_at,
        )
        .join(Account, Account.name == IssuedToken.account)
        .where(IssuedToken.jti == jti)
    ).one_or_none()
    if row is None:
        return None
    return TokenStanding(
        account=row.account,
        subject=row.subject,
        role=row.role,
        expires_at=int(row.expires_at.timestamp()),
        revoked=row.revoked_at is not None,
        account_disabled=row.disabled_at is not None,
        membership=membership_of(session, row.account, row.subject),
    )


def require_good_standing(caller: Principal, standing: TokenStanding | None) -> None:
    """Unauthorized unless the caller's token is recorded as it reads, unrevoked, and its account enabled."""
    # The record is the authority, not the claims: a token whose jti was issued here but whose
    # account, subject, role or lifetime differs from that record was not signed by `gpupool
    # token create` (a key that leaked, another issuer holding it), so it is refused like an unknown one.
    if standing is None or not _claims_match_record(caller, standing):
        raise Unauthorized("the token was not issued by this service; ask the operator for a new one", code="token_unknown")
    if standing.revoked:
        raise Unauthorized("the token has been revoked", code="token_revoked")
    if standing.account_disabled:
        raise Unauthorized(f"the account {caller.account} is disabled", code="account_disabled")


def _claims_match_record(caller: Principal, standing: TokenStanding) -> bool:
    return (
        caller.account == standing.account
        and caller.sub == standing.subject
        and caller.role == standing.role
        # A later exp than recorded would outlive what the operator issued; an earlier one harms nobody.
        and (caller.expires_at is None or caller.expires_at <= standing.expires_at)
    )


def verify_token(settings: Settings, token: str, *, key: str | None = None) -> Principal:
    """The caller behind ``token``, or Unauthorized saying why not."""
    try:
        claims = jwt.decode(
            token,
            key if key is not None else verification_key(settings),
            algorithms=[settings.jwt_algorithm],
            audience=settings.jwt_audience,
            options={"require": list(REQUIRED_CLAIMS)},
        )
    except jwt.ExpiredSignatureError as exc:
        raise Unauthorized("the token has expired", code="token_expired") from exc
    except jwt.InvalidAudienceError as exc:
        raise Unauthorized("the token is not meant for this service (wrong audience)") from exc
    except jwt.MissingRequiredClaimError as exc:
        raise Unauthorized(f"the token lacks the required claim {exc.claim!r}") from exc
    except jwt.InvalidAlgorithmError as exc:
        raise Unauthorized(f"tokens must be signed with {settings.jwt_algorithm}") from exc
    except jwt.InvalidSignatureError as exc:
        raise Unauthorized("the token's signature does not verify") from exc
    except jwt.PyJWTError as exc:
        raise Unauthorized(f"the token is not valid: {exc}") from exc
    account, role, jti = claims.get("account"), claims.get("role", "customer"), claims["jti"]
    if not isinstance(account, str) or not account:
        raise Unauthorized("the token lacks the required claim 'account'")
    if not ACCOUNT_NAME.match(account):
        raise Unauthorized("the token's account is not a valid account name")
    if role not in ROLES:
        raise Unauthorized(f"unknown role {role!r} in token")
    if not isinstance(claims["sub"], str) or not 0 < len(claims["sub"]) <= MAX_SUBJECT_LENGTH:
        raise Unauthorized(f"the token's subject must be 1 to {MAX_SUBJECT_LENGTH} characters")
    if not isinstance(jti, str) or not 0 < len(jti) <= JTI_LENGTH:
        raise Unauthorized(f"the token's jti must be 1 to {JTI_LENGTH} characters")
    # Lowering GPUPOOL_JWT_MAX_TTL_S also cuts off long-lived tokens already out there.
    if claims["exp"] - claims["iat"] > settings.jwt_max_ttl_s:
        raise Unauthorized("the token's lifetime is longer than this service allows")
    return Principal(sub=claims["sub"], account=account, role=role, jti=jti, expires_at=claims["exp"])
