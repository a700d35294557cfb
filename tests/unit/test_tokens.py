"""JWT bearer tokens: issue, verify, and refuse."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gpupool.config import Settings
from gpupool.errors import ConfigError, Unauthorized
from gpupool.tokens import (
    Principal,
    TokenStanding,
    create_token,
    new_claims,
    require_good_standing,
    verify_token,
)

SECRET = "k" * 32 + "-test-secret"
OTHER_SECRET = "z" * 40


@pytest.fixture
def settings() -> Settings:
    return Settings(jwt_secret=SECRET, service_user="gpupool")


@pytest.fixture(scope="module")
def rsa_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("rsa")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = folder / "jwt.key"
    public = folder / "jwt.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture
def rs_settings(rsa_keys: tuple[Path, Path]) -> Settings:
    private, public = rsa_keys
    return Settings(
        jwt_algorithm="RS256",
        jwt_private_key_file=str(private),
        jwt_public_key_file=str(public),
        service_user="gpupool",
    )


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def claims(**changes: Any) -> dict[str, Any]:
    issued = int(now().timestamp())
    base: dict[str, Any] = {
        "sub": "alice",
        "account": "acme",
        "role": "customer",
        "iat": issued,
        "exp": issued + 600,
        "aud": "gpupool",
        "jti": "jti-of-the-test-claims",
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def refused(settings: Settings, token: str) -> Unauthorized:
    with pytest.raises(Unauthorized) as info:
        verify_token(settings, token)
    return info.value


def jti_of(token: str) -> str:
    return jwt.decode(token, options={"verify_signature": False})["jti"]


# --- round trips -----------------------------------------------------------------------


def test_round_trip(settings: Settings) -> None:
    token = create_token(settings, sub="alice", account="acme")
    assert verify_token(settings, token) == Principal(sub="alice", account="acme", role="customer", jti=jti_of(token))


def test_round_trip_admin(settings: Settings) -> None:
    token = create_token(settings, sub="root", account="ops", role="admin")
    principal = verify_token(settings, token)
    assert principal == Principal("root", "ops", "admin", jti_of(token))
    assert principal.is_admin


def test_claims_are_exact(settings: Settings) -> None:
    issued = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    token = create_token(settings, sub="alice", account="acme", ttl_s=120, now=issued)
    assert jwt.get_unverified_header(token) == {"alg": "HS256", "typ": "JWT"}
    decoded = jwt.decode(token, options={"verify_signature": False})
    assert len(decoded.pop("jti")) == 32
    assert decoded == {
        "sub": "alice",
        "account": "acme",
        "role": "customer",
        "iat": 1893553445,
        "exp": 1893553445 + 120,
        "aud": "gpupool",
    }


def test_default_ttl_from_settings(settings: Settings) -> None:
    issued = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    token = create_token(settings.replace(jwt_default_ttl_s=7), sub="a", account="b", now=issued)
    decoded = jwt.decode(token, options={"verify_signature": False})
    assert decoded["exp"] - decoded["iat"] == 7


def test_rs256_round_trip(rs_settings: Settings) -> None:
    token = create_token(rs_settings, sub="alice", account="acme")
    assert jwt.get_unverified_header(token)["alg"] == "RS256"
    assert verify_token(rs_settings, token) == Principal("alice", "acme", "customer", jti_of(token))


def test_explicit_key(settings: Settings) -> None:
    token = jwt.encode(claims(), OTHER_SECRET, algorithm="HS256")
    assert verify_token(settings, token, key=OTHER_SECRET) == Principal("alice", "acme", "customer", "jti-of-the-test-claims")
    assert refused(settings, token).message == "the token's signature does not verify"


# --- refusals --------------------------------------------------------------------------


def test_alg_none_refused(settings: Settings) -> None:
    token = jwt.encode(claims(), None, algorithm="none")
    assert token.endswith(".")
    assert refused(settings, token).message == "tokens must be signed with HS256"


def test_wrong_key(settings: Settings) -> None:
    token = jwt.encode(claims(), OTHER_SECRET, algorithm="HS256")
    assert refused(settings, token).message == "the token's signature does not verify"


def test_tampered_payload(settings: Settings) -> None:
    header, _, signature = create_token(settings, sub="alice", account="acme").split(".")
    forged = base64.urlsafe_b64encode(json.dumps(claims(role="admin")).encode()).rstrip(b"=").decode()
    assert refused(settings, f"{header}.{forged}.{signature}").message == "the token's signature does not verify"


def test_expired(settings: Settings) -> None:
    token = create_token(settings, sub="alice", account="acme", ttl_s=60, now=now() - dt.timedelta(hours=2))
    error = refused(settings, token)
    assert (error.code, error.message) == ("token_expired", "the token has expired")


def test_issued_in_the_future(settings: Settings) -> None:
    token = create_token(settings, sub="alice", account="acme", now=now() + dt.timedelta(hours=1))
    assert refused(settings, token).message.startswith("the token is not valid: ")


def test_wrong_audience(settings: Settings) -> None:
    token = create_token(settings.replace(jwt_audience="someone-else"), sub="alice", account="acme")
    assert refused(settings, token).message == "the token is not meant for this service (wrong audience)"


@pytest.mark.parametrize("claim", ["exp", "iat", "sub", "aud", "jti"])
def test_missing_required_claim(settings: Settings, claim: str) -> None:
    token = jwt.encode(claims(**{claim: None}), SECRET, algorithm="HS256")
    error = refused(settings, token)
    assert (error.code, error.message) == ("unauthorized", f"the token lacks the required claim {claim!r}")


@pytest.mark.parametrize("account", [None, "", 42])
def test_missing_or_bad_account(settings: Settings, account: Any) -> None:
    token = jwt.encode({**claims(), "account": account} if account is not None else claims(account=None), SECRET)
    assert refused(settings, token).message == "the token lacks the required claim 'account'"


def test_unknown_role(settings: Settings) -> None:
    token = jwt.encode(claims(role="superuser"), SECRET, algorithm="HS256")
    assert refused(settings, token).message == "unknown role 'superuser' in token"


def test_missing_role_means_customer(settings: Settings) -> None:
    token = jwt.encode(claims(role=None), SECRET, algorithm="HS256")
    assert verify_token(settings, token).role == "customer"


@pytest.mark.parametrize("sub", ["", "x" * 256])
def test_subject_must_fit_a_job_owner(settings: Settings, sub: str) -> None:
    token = jwt.encode(claims(sub=sub), SECRET, algorithm="HS256")
    assert refused(settings, token).message == "the token's subject must be 1 to 255 characters"


@pytest.mark.parametrize("account", ["Acme", "a b", "a;b", "x" * 33])
def test_account_claim_must_be_an_account_name(settings: Settings, account: str) -> None:
    token = jwt.encode(claims(account=account), SECRET, algorithm="HS256")
    assert refused(settings, token).message == "the token's account is not a valid account name"


def test_non_string_subject(settings: Settings) -> None:
    token = jwt.encode(claims(sub=5), SECRET, algorithm="HS256")
    assert refused(settings, token).message.startswith("the token is not valid: ")


def test_every_token_gets_its_own_jti(settings: Settings) -> None:
    ids = {jti_of(create_token(settings, sub="alice", account="acme")) for _ in range(50)}
    assert len(ids) == 50


@pytest.mark.parametrize("jti", ["", "j" * 65])
def test_jti_must_be_a_short_string(settings: Settings, jti: str) -> None:
    token = jwt.encode(claims(jti=jti), SECRET, algorithm="HS256")
    assert refused(settings, token).message == "the token's jti must be 1 to 64 characters"
    numeric = jwt.encode(claims(jti=7), SECRET, algorithm="HS256")
    assert refused(settings, numeric).message == "the token is not valid: JWT ID must be a string"


def test_lifetime_over_the_ceiling_is_refused_even_when_signed(settings: Settings) -> None:
    issued = int(now().timestamp())
    token = jwt.encode(claims(iat=issued, exp=issued + 3601), SECRET, algorithm="HS256")
    assert refused(settings.replace(jwt_max_ttl_s=3600), token).message == "the token's lifetime is longer than this service allows"
    assert verify_token(settings.replace(jwt_max_ttl_s=3601), token).sub == "alice"


def test_recorded_claims_match_the_signed_ones(settings: Settings) -> None:
    issued = dt.datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=dt.UTC)
    made = new_claims(settings, sub="alice", account="acme", ttl_s=90, now=issued)
    assert (made.issued_at, made.expires_at) == (issued.replace(microsecond=0), issued.replace(microsecond=0) + dt.timedelta(seconds=90))


# --- standing: what the database says about a verified token ----------------------------

CALLER = Principal("alice", "acme", "customer", "abc", expires_at=2_000_000_000)


def recorded(**changes: Any) -> TokenStanding:
    """The record of CALLER's token as issue_token wrote it, with ``changes``."""
    fields: dict[str, Any] = {
        "account": "acme", "subject": "alice", "role": "customer", "expires_at": 2_000_000_000,
        "revoked": False, "account_disabled": False,
    }
    return TokenStanding(**{**fields, **changes})


UNKNOWN = ("token_unknown", "the token was not issued by this service; ask the operator for a new one")


@pytest.mark.parametrize(
    ("standing", "code", "message"),
    [
        (None, *UNKNOWN),
        (recorded(account="other"), *UNKNOWN),
        # Signed with the right key and carrying a recorded jti, but claiming more than was issued.
        (recorded(role="admin"), *UNKNOWN),
        (recorded(subject="mallory"), *UNKNOWN),
        (recorded(expires_at=1_999_999_999), *UNKNOWN),
        (recorded(revoked=True), "token_revoked", "the token has been revoked"),
        (recorded(revoked=True, account_disabled=True), "token_revoked", "the token has been revoked"),
        (recorded(account_disabled=True), "account_disabled", "the account acme is disabled"),
    ],
)
def test_bad_standing_is_refused(standing: TokenStanding | None, code: str, message: str) -> None:
    with pytest.raises(Unauthorized) as info:
        require_good_standing(CALLER, standing)
    assert (info.value.code, info.value.message) == (code, message)


def test_a_token_that_claims_admin_over_a_customer_record_is_refused() -> None:
    with pytest.raises(Unauthorized):
        require_good_standing(Principal("alice", "acme", "admin", "abc", expires_at=2_000_000_000), recorded())


def test_good_standing_passes() -> None:
    require_good_standing(CALLER, recorded())
    # A token that ends sooner than its record claims nothing it was not given.
    require_good_standing(Principal("alice", "acme", "customer", "abc", expires_at=1_000), recorded())


def test_garbage_token(settings: Settings) -> None:
    assert refused(settings, "not.a.token").message.startswith("the token is not valid: ")
    assert refused(settings, "").message.startswith("the token is not valid: ")


def test_hs256_token_refused_when_rs256_configured(rs_settings: Settings) -> None:
    token = jwt.encode(claims(), OTHER_SECRET, algorithm="HS256")
    assert refused(rs_settings, token).message == "tokens must be signed with RS256"


def test_hs256_signed_with_the_public_key_refused(rs_settings: Settings, rsa_keys: tuple[Path, Path]) -> None:
    # The classic key-confusion forgery: HMAC keyed with the (public) RSA key.
    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signing_input = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + b"." + b64(json.dumps(claims(role="admin")).encode())
    signature = hmac.new(rsa_keys[1].read_bytes(), signing_input, hashlib.sha256).digest()
    token = (signing_input + b"." + b64(signature)).decode()
    assert refused(rs_settings, token).message == "tokens must be signed with RS256"


def test_rs256_token_refused_when_hs256_configured(settings: Settings, rs_settings: Settings) -> None:
    token = create_token(rs_settings, sub="alice", account="acme")
    assert refused(settings, token).message == "tokens must be signed with HS256"


# --- configuration errors --------------------------------------------------------------


@pytest.mark.parametrize("secret", ["", "short", "x" * 31])
def test_short_secret_is_a_config_error(secret: str) -> None:
    weak = Settings(jwt_secret=secret, service_user="gpupool")
    with pytest.raises(ConfigError, match="at least 32 characters"):
        create_token(weak, sub="alice", account="acme")
    with pytest.raises(ConfigError, match="at least 32 characters"):
        verify_token(weak, jwt.encode(claims(), SECRET, algorithm="HS256"))


def test_secret_of_exactly_32_characters_is_enough() -> None:
    ok = Settings(jwt_secret="x" * 32, service_user="gpupool")
    token = create_token(ok, sub="a", account="b")
    assert verify_token(ok, token) == Principal("a", "b", "customer", jti_of(token))


def test_rs256_without_key_files(rs_settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="GPUPOOL_JWT_PRIVATE_KEY_FILE is not set"):
        create_token(rs_settings.replace(jwt_private_key_file=""), sub="a", account="b")
    with pytest.raises(ConfigError, match="GPUPOOL_JWT_PUBLIC_KEY_FILE is not set"):
        verify_token(rs_settings.replace(jwt_public_key_file=""), "x.y.z")
    with pytest.raises(ConfigError, match="cannot read the JWT public key"):
        verify_token(rs_settings.replace(jwt_public_key_file=str(tmp_path / "absent.pub")), "x.y.z")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"role": "root"}, "role must be one of customer, admin"),
        ({"sub": ""}, "a token needs a user of 1 to 255 characters and a valid account name"),
        ({"sub": "u" * 256}, "a token needs a user of 1 to 255 characters and a valid account name"),
        ({"account": ""}, "a token needs a user of 1 to 255 characters and a valid account name"),
        ({"account": "Not Valid"}, "a token needs a user of 1 to 255 characters and a valid account name"),
        ({"ttl_s": 0}, "--ttl must be a positive number of seconds"),
        ({"ttl_s": -5}, "--ttl must be a positive number of seconds"),
        ({"ttl_s": 90 * 86400 + 1}, "--ttl 7776001 is longer than the ceiling of 7776000 seconds (GPUPOOL_JWT_MAX_TTL_S)"),
    ],
)
def test_create_token_argument_errors(settings: Settings, kwargs: dict[str, Any], fragment: str) -> None:
    arguments: dict[str, Any] = {"sub": "alice", "account": "acme", **kwargs}
    with pytest.raises(ConfigError) as info:
        create_token(settings, **arguments)
    assert info.value.message == fragment
