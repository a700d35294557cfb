"""Session jobs through the in-process API: submit rules, GET /jobs/<id>/session, and the proxy's endpoints' gates.

The proxied path itself (nginx, the shim, the app) is tests/live/test_sessions.py.
"""

from __future__ import annotations

import re

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from tests.conftest import bearer, create_app_for_tests

PROXY_KEY = "api-test-proxy-key-" + "q" * 30
APP_COMMAND = 'exec python3 -m http.server --bind 127.0.0.1 "$GPUPOOL_APP_PORT"'


@pytest.fixture
def app(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker) -> Flask:
    return create_app_for_tests(settings.replace(session_proxy_key=PROXY_KEY), slurm, session_factory)


def submit_session(client: FlaskClient, auth: dict[str, str], **extra: object) -> dict:
    response = client.post("/submit", headers=auth, json={"template": "webapp", "gpus": 1, "params": {"command": APP_COMMAND}, **extra})
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def test_idle_timeout_is_for_session_templates_only_and_never_above_the_templates(
    client: FlaskClient, auth: dict[str, str]
) -> None:
    refused = client.post("/submit", headers=auth, json={"template": "hello", "gpus": 1, "idle_timeout_min": 5})
    assert refused.status_code == 422 and "session templates only" in refused.get_json()["message"]
    assert client.get("/jobs", headers=auth).get_json()["jobs"] == []
    shorter = submit_session(client, auth, idle_timeout_min=5)
    longer = submit_session(client, auth, idle_timeout_min=600)
    assert shorter["session"] is True
    assert client.get(f"/jobs/{shorter['job_id']}/session", headers=auth).get_json()["idle_timeout_min"] == 5
    assert client.get(f"/jobs/{longer['job_id']}/session", headers=auth).get_json()["idle_timeout_min"] == 30
    templates = {t["name"]: t for t in client.get("/templates", headers=auth).get_json()["templates"]}
    assert (templates["webapp"]["session"], templates["webapp"]["idle_timeout_min"]) == (True, 30)
    assert (templates["hello"]["session"], templates["hello"]["idle_timeout_min"]) == (False, None)


def test_a_session_has_its_own_origin_and_a_new_single_use_link_per_call(
    client: FlaskClient, auth: dict[str, str], settings: Settings, account: str, other_account: str
) -> None:
    job = submit_session(client, auth)
    first = client.get(f"/jobs/{job['job_id']}/session", headers=auth).get_json()
    second = client.get(f"/jobs/{job['job_id']}/session", headers=auth).get_json()
    assert first["state"] in ("starting", "ready")
    label = re.fullmatch(r"http://([0-9a-f]{20})\.sessions\.localhost:8080/", first["url"])
    assert label is not None and job["job_id"].replace("-", "")[:20] != label.group(1)
    assert first["link"].startswith(f"http://{label.group(1)}.sessions.localhost:8080/.gpupool/open?link=")
    assert first["link"] != second["link"] and first["link_expires_in_s"] == 60
    # Another account's token: the 404 of a job that does not exist.
    other = client.get(f"/jobs/{job['job_id']}/session", headers=bearer(settings, other_account))
    missing = client.get("/jobs/00000000-0000-0000-0000-000000000000/session", headers=auth)
    assert other.status_code == missing.status_code == 404
    # An admin sees the session but gets no link: the cookie would open the tenant's app.
    admin = client.get(f"/jobs/{job['job_id']}/session", headers=bearer(settings, other_account, role="admin"))
    assert admin.status_code == 200 and admin.get_json()["link"] is None


def test_a_batch_job_has_no_session(client: FlaskClient, auth: dict[str, str]) -> None:
    job = client.post("/submit", headers=auth, json={"template": "hello", "gpus": 1}).get_json()
    answer = client.get(f"/jobs/{job['job_id']}/session", headers=auth)
    assert answer.status_code == 404 and "is not a session" in answer.get_json()["message"]
    assert job["session"] is False and job["end_reason"] is None


def test_the_proxys_endpoints_answer_only_the_proxy(client: FlaskClient, auth: dict[str, str]) -> None:
    job = submit_session(client, auth)
    label = client.get(f"/jobs/{job['job_id']}/session", headers=auth).get_json()["url"].split("//")[1].split(".")[0]
    for headers in ({}, {"X-Gpupool-Proxy-Key": "wrong"}, {"X-Gpupool-Proxy-Key": ""}, auth):
        for path in ("/session-proxy/auth", "/session-proxy/open?link=x"):
            assert client.get(path, headers={**headers, "X-Gpupool-Session": label}).status_code == 404, (path, headers)
    proxy = {"X-Gpupool-Proxy-Key": PROXY_KEY, "X-Gpupool-Session": label}
    assert client.get("/session-proxy/auth", headers=proxy).status_code == 401  # no cookie: sign in
    client.set_cookie("gpupool_session_grant", "not-a-grant")
    assert client.get("/session-proxy/auth", headers=proxy).status_code == 403  # nginx answers 404
    assert client.get("/session-proxy/open?link=not-a-link", headers=proxy).status_code == 404
