"""Revoked tokens, disabled accounts and unrecorded tokens get 401 on their next request."""

from __future__ import annotations

import datetime as dt

import jwt
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker
from werkzeug.test import TestResponse

from gpupool.config import Settings
from gpupool.models import Account
from gpupool.slurm.client import SlurmClient
from gpupool.tokens import create_token, revoke_token
from tests.conftest import bearer, create_app_for_tests


def no_cache_client(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker) -> FlaskClient:
    """Every request asks the database, so a change shows on the very next one."""
    return create_app_for_tests(settings.replace(token_check_cache_s=0), slurm, session_factory).test_client()


def jti_of(headers: dict[str, str]) -> str:
    token = headers["Authorization"].removeprefix("Bearer ")
    return jwt.decode(token, options={"verify_signature": False})["jti"]


def revoke(session_factory: sessionmaker, jti: str) -> None:
    with session_factory() as session, session.begin():
        revoke_token(session, jti, by="test", reason="leaked", now=dt.datetime.now(dt.UTC))


def set_disabled(session_factory: sessionmaker, account: str, disabled: bool) -> None:
    with session_factory() as session, session.begin():
        row = session.get(Account, account)
        assert row is not None
        row.disabled_at = dt.datetime.now(dt.UTC) if disabled else None


def assert_refused(response: TestResponse, code: str, message: str) -> None:
    assert response.status_code == 401, response.get_data(as_text=True)
    assert response.get_json() == {"error": code, "message": message}


def test_a_revoked_token_gets_401_on_its_next_request(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, account: str
) -> None:
    client = no_cache_client(settings, slurm, session_factory)
    leaked, other = bearer(settings, account), bearer(settings, account, sub="bob")
    assert client.get("/jobs", headers=leaked).status_code == 200

    revoke(session_factory, jti_of(leaked))
    assert_refused(client.get("/jobs", headers=leaked), "token_revoked", "the token has been revoked")
    assert_refused(client.post("/submit", headers=leaked, json={"template": "hello"}), "token_revoked", "the token has been revoked")
    assert client.get("/jobs", headers=other).status_code == 200  # only that one token


def test_a_disabled_account_gets_401_until_enabled_again(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, account: str
) -> None:
    client = no_cache_client(settings, slurm, session_factory)
    customer, admin = bearer(settings, account), bearer(settings, account, sub="ops", role="admin")
    assert client.get("/jobs", headers=customer).status_code == 200

    set_disabled(session_factory, account, True)
    for headers in (customer, admin):
        assert_refused(client.get("/jobs", headers=headers), "account_disabled", f"the account {account} is disabled")

    set_disabled(session_factory, account, False)
    assert client.get("/jobs", headers=customer).status_code == 200


def test_a_signed_token_the_database_does_not_know_gets_401(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, account: str
) -> None:
    client = no_cache_client(settings, slurm, session_factory)
    unrecorded = create_token(settings, sub="alice", account=account)
    response = client.get("/jobs", headers={"Authorization": f"Bearer {unrecorded}"})
    assert_refused(response, "token_unknown", "the token was not issued by this service; ask the operator for a new one")


def test_a_token_without_a_jti_gets_401(client: FlaskClient, settings: Settings, account: str) -> None:
    issued = int(dt.datetime.now(dt.UTC).timestamp())
    claims = {"sub": "alice", "account": account, "iat": issued, "exp": issued + 60, "aud": settings.jwt_audience}
    old_style = jwt.encode(claims, settings.jwt_secret, algorithm="HS256")
    response = client.get("/jobs", headers={"Authorization": f"Bearer {old_style}"})
    assert_refused(response, "unauthorized", "the token lacks the required claim 'jti'")


def test_each_worker_trusts_its_last_look_for_token_check_cache_s(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, account: str
) -> None:
    # A cache far longer than the test: what the first request read is what the worker keeps.
    cached = create_app_for_tests(settings.replace(token_check_cache_s=3600), slurm, session_factory).test_client()
    headers = bearer(settings, account)
    assert cached.get("/jobs", headers=headers).status_code == 200

    revoke(session_factory, jti_of(headers))
    assert cached.get("/jobs", headers=headers).status_code == 200  # within the bound: still accepted
    # A worker that had not seen the token yet (or whose entry expired) refuses it.
    fresh = create_app_for_tests(settings.replace(token_check_cache_s=3600), slurm, session_factory).test_client()
    assert_refused(fresh.get("/jobs", headers=headers), "token_revoked", "the token has been revoked")
