"""Bad input gets a clear 4xx JSON error, and nothing reaches Slurm twice."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import jwt
import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker
from werkzeug.test import TestResponse

from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from gpupool.tokens import create_token
from tests.conftest import bearer, create_app_for_tests, recorded_token, slurm_cmd

HELLO = {"template": "hello", "gpus": 1, "params": {"message": "hi", "seconds": 0}}


def assert_error(response: TestResponse, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) >= {"error", "message"}
    assert body["message"]
    if code is not None:
        assert body["error"] == code
    return body


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


def test_health_and_openapi_need_no_token(client: FlaskClient) -> None:
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json()["checks"] == {"database": "ok", "slurm": "ok"}
    assert client.get("/openapi.json").status_code == 200


def test_unknown_fields_are_listed(client: FlaskClient, auth: dict[str, str]) -> None:
    body = assert_error(client.post("/submit", headers=auth, json={**HELLO, "partition": "debug", "qos": "x"}), 400, "unknown_fields")
    assert body["unknown"] == ["partition", "qos"]
    assert "template" in body["valid"] and "gpus" in body["valid"]
    assert "partition" in body["message"] and "container_image" in body["message"]


@pytest.mark.parametrize(
    ("data", "content_type", "status", "code"),
    [
        ("{not json", "application/json", 400, "bad_request"),
        ("[1, 2]", "application/json", 400, "bad_request"),
        ('{"template": "hello"}', "text/plain", 415, "unsupported_media_type"),
        ("template=hello", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
    ],
)
def test_malformed_bodies(client: FlaskClient, auth: dict[str, str], data: str, content_type: str, status: int, code: str) -> None:
    assert_error(client.post("/submit", headers=auth, data=data, content_type=content_type), status, code)


def test_one_megabyte_string_is_refused_with_413(client: FlaskClient, auth: dict[str, str], account: str) -> None:
    body = {**HELLO, "params": {"message": "x" * (1024 * 1024)}}
    assert_error(client.post("/submit", headers=auth, json=body), 413, "payload_too_large")
    assert slurm_cmd("squeue", "-h", f"--account={account}").strip() == ""


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"gpus": 5}, "at most 4"),
        ({"gpus": 0}, "gpus"),
        ({"gpus": "2"}, "gpus"),
        ({"gpus": 1.5}, "gpus"),
        ({"gpu_type": "a100"}, "a100"),
        ({"gpu_type": "RTX;4090"}, "gpu_type"),
        ({"template": "nope"}, "unknown template"),
        ({"template": "../etc"}, "template"),
        ({"params": {"message": "a\x00b"}}, "NUL"),
        ({"params": {"seconds": 3601}}, "3600"),
        ({"params": {"seconds": -1}}, "seconds"),
        ({"params": {"command": "rm -rf /"}}, "command"),
        ({"params": "message"}, "params"),
        ({"name": "a\n0"}, "control characters"),
        ({"time_limit_min": 10**6}, "time_limit_min"),
        ({"container_image": "ubuntu:22.04"}, "without containers"),
        ({"container_image": "nvcr.io#nvidia/pytorch:24.01-py3;rm"}, "container_image"),
    ],
)
def test_invalid_values_get_422(
    client: FlaskClient, auth: dict[str, str], account: str, changes: dict, needle: str
) -> None:
    body = assert_error(client.post("/submit", headers=auth, json={**HELLO, **changes}), 422)
    assert needle in body["message"]
    assert slurm_cmd("squeue", "-h", f"--account={account}").strip() == ""


def test_inference_template_is_limited_to_one_gpu(client: FlaskClient, auth: dict[str, str]) -> None:
    body = {"template": "inference", "gpus": 2, "params": {"model": "m", "input": "x"}}
    assert "at most 1" in assert_error(client.post("/submit", headers=auth, json=body), 422)["message"]


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


def test_wrong_methods_and_paths(client: FlaskClient, auth: dict[str, str]) -> None:
    response = client.put("/jobs/x", headers=auth, json={})
    assert_error(response, 405, "method_not_allowed")
    assert "DELETE" in response.headers["Allow"]
    assert_error(client.get("/submit", headers=auth), 405)
    assert_error(client.get("/nothing-here", headers=auth), 404)
    assert_error(client.get("/jobs/x/logs?stream=stdin", headers=auth), 404)


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
