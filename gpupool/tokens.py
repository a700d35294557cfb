"""JWT bearer tokens: issued by ``gpupool token create``, verified by the API.

Verification pins the algorithm from settings (never from the token header),
so ``alg: none`` and HS/RS confusion are refused, and it requires ``exp``,
``iat``, ``sub`` and ``aud``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from gpupool.config import Settings
from gpupool.errors import ConfigError, Unauthorized
from gpupool.models.accounts import ACCOUNT_NAME

ROLES = ("customer", "admin")
MAX_SUBJECT_LENGTH = 255  # the width of jobs.owner
REQUIRED_CLAIMS = ("exp", "iat", "sub", "aud")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's subject, its account and role."""

    sub: str
    account: str
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


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


def create_token(
    settings: Settings,
    *,
    sub: str,
    account: str,
    role: str = "customer",
    ttl_s: int | None = None,
    now: dt.datetime | None = None,
) -> str:
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}")
    if not 0 < len(sub) <= MAX_SUBJECT_LENGTH or not ACCOUNT_NAME.match(account):
        raise ConfigError(f"a token needs a user of 1 to {MAX_SUBJECT_LENGTH} characters and a valid account name")
    issued = now or dt.datetime.now(dt.UTC)
    lifetime = settings.jwt_default_ttl_s if ttl_s is None else ttl_s
    if lifetime <= 0:
        raise ConfigError("--ttl must be a positive number of seconds")
    claims: dict[str, Any] = {
        "sub": sub,
        "account": account,
        "role": role,
        "iat": int(issued.timestamp()),
        "exp": int((issued + dt.timedelta(seconds=lifetime)).timestamp()),
        "aud": settings.jwt_audience,
    }
    return jwt.encode(claims, signing_key(settings), algorithm=settings.jwt_algorithm)


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
    account, role = claims.get("account"), claims.get("role", "customer")
    if not isinstance(account, str) or not account:
        raise Unauthorized("the token lacks the required claim 'account'")
    if not ACCOUNT_NAME.match(account):
        raise Unauthorized("the token's account is not a valid account name")
    if role not in ROLES:
        raise Unauthorized(f"unknown role {role!r} in token")
    if not isinstance(claims["sub"], str) or not 0 < len(claims["sub"]) <= MAX_SUBJECT_LENGTH:
        raise Unauthorized(f"the token's subject must be 1 to {MAX_SUBJECT_LENGTH} characters")
    return Principal(sub=claims["sub"], account=account, role=role)
