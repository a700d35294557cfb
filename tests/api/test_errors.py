"""Bad input gets a clear 4xx JSON error, and nothing reaches Slurm twice."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import jwt
import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from gpupool.tokens import create_token
from tests.conftest import bearer, create_app_for_tests, recorded_token, slurm_cmd
from tests.support.http import assert_error

HELLO = {"template": "hello", "gpus": 1, "params": {"message": "hi", "seconds": 0}}


def claims(settings: Settings, account: str, **changes: object) -> dict:
    now = int(dt.datetime.now(dt.UTC).timestamp())
    base = {"sub": "alice", "account": account, "role": "customer", "iat": now, "exp": now + 600, "aud": settings.jwt_audience}
    base.update(changes)
    return {key: value for key, value in base.items() if value is not None}


@pytest.mark.parametrize(
    "make_header",
    [
        pytest.param(lambda s, a: {}, id="no-token"),
        pytest.param(lambda s, a: {"Authorization": "Basic dXNlcjpwdw=="}, id="not-bearer"),
        pytest.param(lambda s, a: {"Authorization": "Bearer not.a.jwt"}, id="garbage"),
        pytest.param(lambda s, a: {"Authorization": "Bearer " + jwt.encode(claims(s, a), None, algorithm="none")}, id="alg-none"),
        pytest.param(lambda s, a: {"Authorization": "Bearer " + jwt.encode(claims(s, a), "w" * 40, algorithm="HS256")}, id="wrong-key"),
        pytest.param(lambda s, a: {"Authorization": "Bearer " + jwt.encode(claims(s, a, exp=1, iat=0), s.jwt_secret, algorithm="HS256")}, id="expired"),
        pytest.param(lambda s, a: {"Authorization": "Bearer " + jwt.encode(claims(s, a, aud="someone-else"), s.jwt_secret, algorithm="HS256")}, id="wrong-audience"),
        pytest.param(lambda s, a: {"Authorization": "Bearer " + jwt.encode(claims(s, a, exp=None), s.jwt_secret, algorithm="HS256")}, id="no-exp"),
        pytest.param(lambda s, a: {"Authorization": "Bearer " + jwt.encode(claims(s, a, iat=None), s.jwt_secret, algorithm="HS256")}, id="no-iat"),
        pytest.param(lambda s, a: {"Authorization": "Bearer " + jwt.encode(claims(s, a, sub=None), s.jwt_secret, algorithm="HS256")}, id="no-sub"),
        pytest.param(lambda s, a: {"Authorization": "Bearer " + jwt.encode(claims(s, a, aud=None), s.jwt_secret, algorithm="HS256")}, id="no-aud"),
    ],
)
def test_bad_tokens_get_401(
    client: FlaskClient, settings: Settings, account: str, make_header: Callable[[Settings, str], dict[str, str]]
) -> None:
    for method, path in (("get", "/jobs"), ("post", "/submit")):
        response = getattr(client, method)(path, headers=make_header(settings, account), json=HELLO)
        assert_error(response, 401)
    assert slurm_cmd("squeue", "-h", f"--account={account}").strip() == ""


def test_one_megabyte_string_is_refused_with_413(client: FlaskClient, auth: dict[str, str], account: str) -> None:
    body = {**HELLO, "params": {"message": "x" * (1024 * 1024)}}
    assert_error(client.post("/submit", headers=auth, json=body), 413, "payload_too_large")
    assert slurm_cmd("squeue", "-h", f"--account={account}").strip() == ""


def test_container_image_must_be_on_the_allowlist(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, account: str
) -> None:
    pyxis = settings.replace(container_runtime="pyxis", container_allowlist=("nvcr.io#nvidia/*",))
    client = create_app_for_tests(pyxis, slurm, session_factory).test_client()
    body = {**HELLO, "container_image": "docker.io/evil/miner:latest"}
    refused = assert_error(client.post("/submit", headers=bearer(pyxis, account), json=body), 422)
    assert refused["allowed"] == ["nvcr.io#nvidia/*"]


def test_token_for_an_unknown_account_is_refused(client: FlaskClient, settings: Settings) -> None:
    # `token create` refuses such an account, so only a token signed elsewhere can name one.
    ghost = create_token(settings, sub="alice", account="ghost")
    assert_error(client.post("/submit", headers={"Authorization": f"Bearer {ghost}"}, json=HELLO), 401, "token_unknown")


def test_jobs_of_other_accounts_are_invisible(
    client: FlaskClient, auth: dict[str, str], settings: Settings, other_account: str
) -> None:
    job = client.post("/submit", headers=auth, json=HELLO).get_json()
    stranger = bearer(settings, other_account, sub="mallory")
    for method, path in (("get", ""), ("get", "/logs"), ("delete", "")):
        assert_error(getattr(client, method)(f"/jobs/{job['job_id']}{path}", headers=stranger), 404, "not_found")
    assert client.get("/jobs", headers=stranger).get_json()["jobs"] == []
    admin = bearer(settings, other_account, sub="root", role="admin")
    assert client.get(f"/jobs/{job['job_id']}", headers=admin).status_code == 200
    everyone = [j["job_id"] for j in client.get("/jobs", headers=admin).get_json()["jobs"]]
    assert job["job_id"] in everyone
    theirs = client.get(f"/jobs?account={other_account}", headers=admin).get_json()["jobs"]
    assert theirs == []
    # A customer may name only their own account.
    assert_error(client.get(f"/jobs?account={other_account}", headers=auth), 404, "not_found")
    own = client.get(f"/jobs?account={job['account']}", headers=auth).get_json()["jobs"]
    assert [j["job_id"] for j in own] == [job["job_id"]]
    assert_error(client.get("/jobs/00000000-0000-0000-0000-000000000000", headers=auth), 404)


def test_idempotency_key_returns_the_same_job_and_submits_once(
    client: FlaskClient, auth: dict[str, str], account: str
) -> None:
    headers = {**auth, "Idempotency-Key": "order-42"}
    queue = ("squeue", "-h", "-t", "all", f"--account={account}", "-o", "%k")
    before = slurm_cmd(*queue).split()
    first = client.post("/submit", headers=headers, json=HELLO)
    second = client.post("/submit", headers=headers, json=HELLO)
    assert first.status_code == second.status_code == 201
    assert second.headers["Idempotent-Replayed"] == "true"
    assert second.get_json()["job_id"] == first.get_json()["job_id"]
    assert second.get_json()["slurm_job_id"] == first.get_json()["slurm_job_id"]
    new_tags = [tag for tag in slurm_cmd(*queue).split() if tag not in before]
    assert new_tags == [f"gpupool:{first.get_json()['job_id']}"]

    clash = client.post("/submit", headers=headers, json={**HELLO, "gpus": 2})
    body = assert_error(clash, 409, "idempotency_key_reused")
    assert body["job_id"] == first.get_json()["job_id"]
    assert_error(client.post("/submit", headers={**auth, "Idempotency-Key": "x" * 300}, json=HELLO), 400)


def test_tokens_from_the_cli_helper_work_until_they_expire(client: FlaskClient, settings: Settings, account: str) -> None:
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    stale = create_token(settings, sub="alice", account=account, ttl_s=60, now=past)
    body = assert_error(client.get("/jobs", headers={"Authorization": f"Bearer {stale}"}), 401, "token_expired")
    assert "expired" in body["message"]


def test_a_token_verified_while_valid_is_refused_once_it_expires(client: FlaskClient, settings: Settings, account: str) -> None:
    # Verified claims are reused for token_check_cache_s (5 s here), but never past the token's own expiry.
    headers = {"Authorization": "Bearer " + recorded_token(settings, account, ttl_s=2)}
    assert client.get("/jobs", headers=headers).status_code == 200
    time.sleep(3)
    body = assert_error(client.get("/jobs", headers=headers), 401, "token_expired")
    assert "expired" in body["message"]
