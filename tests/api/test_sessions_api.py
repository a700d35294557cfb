"""Session jobs through the in-process API: submit rules, GET /jobs/<id>/session, and the proxy's endpoints' gates.

The proxied path itself (nginx, the shim, the app) is tests/live/test_sessions.py.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.models.sessions import COOKIE, LINK
from gpupool.sessions import new_grant_value
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


def label_of(client: FlaskClient, auth: dict[str, str], job_id: str) -> str:
    return client.get(f"/jobs/{job_id}/session", headers=auth).get_json()["url"].split("//")[1].split(".")[0]


def link_value(client: FlaskClient, auth: dict[str, str], job_id: str) -> str:
    return client.get(f"/jobs/{job_id}/session", headers=auth).get_json()["link"].split("?link=")[1]


def test_the_link_answers_a_page_of_the_sessions_origin_with_a_strict_host_only_cookie(
    client: FlaskClient, auth: dict[str, str]
) -> None:
    """A redirect to / would lose the cookie: a Strict cookie goes on no request of a navigation another site began."""
    job = submit_session(client, auth)
    proxy = {"X-Gpupool-Proxy-Key": PROXY_KEY, "X-Gpupool-Session": label_of(client, auth, job["job_id"])}
    opened = client.get(f"/session-proxy/open?link={link_value(client, auth, job['job_id'])}", headers=proxy)
    assert opened.status_code == 200 and opened.mimetype == "text/html"
    assert '<meta http-equiv="refresh" content="0; url=/">' in opened.get_data(as_text=True)
    assert opened.headers["Cache-Control"] == "no-store" and opened.headers["Referrer-Policy"] == "no-referrer"
    name, _, rest = opened.headers["Set-Cookie"].partition("=")
    attributes = sorted(part.strip() for part in rest.split(";")[1:] if not part.strip().startswith(("Expires", "Max-Age")))
    assert (name, attributes) == ("gpupool_session_grant", ["HttpOnly", "Path=/", "SameSite=Strict"])


def test_over_tls_the_cookie_is_host_prefixed_and_secure(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, account: str, auth: dict[str, str]
) -> None:
    """__Host-: the browser keeps it to the origin that set it, and no sibling's script can set one in its name."""
    tls = settings.replace(session_proxy_key=PROXY_KEY, sessions_url="https://sessions.example.net")
    client = create_app_for_tests(tls, slurm, session_factory).test_client()
    job = submit_session(client, auth)
    proxy = {"X-Gpupool-Proxy-Key": PROXY_KEY, "X-Gpupool-Session": label_of(client, auth, job["job_id"])}
    opened = client.get(f"/session-proxy/open?link={link_value(client, auth, job['job_id'])}", headers=proxy)
    name, _, rest = opened.headers["Set-Cookie"].partition("=")
    cookie = rest.split(";")[0]
    attributes = sorted(part.strip() for part in rest.split(";")[1:] if not part.strip().startswith(("Expires", "Max-Age")))
    assert (name, attributes) == ("__Host-gpupool_session_grant", ["HttpOnly", "Path=/", "SameSite=Strict", "Secure"])
    # Only that name counts: the same value under the plain name is no cookie at all (sign in).
    client.delete_cookie("__Host-gpupool_session_grant")
    client.set_cookie("gpupool_session_grant", cookie)
    assert client.get("/session-proxy/auth", headers=proxy).status_code == 401
    client.set_cookie("__Host-gpupool_session_grant", cookie)
    assert client.get("/session-proxy/auth", headers=proxy).status_code in (204, 403)  # 403 while the job starts


@contextmanager
def statements_run(connection: Connection) -> Iterator[list[str]]:
    """Every SQL statement sent through the test's database connection while the block runs."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        # The test's rolled-back transaction wraps each request's in a savepoint: those read nothing.
        if not re.match(r"(RELEASE |ROLLBACK TO )?SAVEPOINT ", statement):
            seen.append(statement)

    event.listen(connection, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(connection, "before_cursor_execute", record)


def test_made_up_cookies_and_links_cost_the_database_nothing(
    client: FlaskClient, auth: dict[str, str], settings: Settings, db_connection: Connection
) -> None:
    """A flood of made-up cookies and links (or another session's) is refused on its MAC, before any query;
    every answer says how long nginx keeps it (X-Accel-Expires), refusals included."""
    mine, other = submit_session(client, auth), submit_session(client, auth)
    label, other_label = label_of(client, auth, mine["job_id"]), label_of(client, auth, other["job_id"])
    proxy = {"X-Gpupool-Proxy-Key": PROXY_KEY, "X-Gpupool-Session": label}
    other_proxy = {**proxy, "X-Gpupool-Session": other_label}
    opened = client.get(f"/session-proxy/open?link={link_value(client, auth, other['job_id'])}", headers=other_proxy)
    other_cookie = opened.headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    client.delete_cookie("gpupool_session_grant")
    keyed, rekeyed = settings.replace(session_proxy_key=PROXY_KEY), settings.replace(session_proxy_key="another-" + "x" * 30)
    made_up = [secrets.token_urlsafe(32), secrets.token_urlsafe(32) + "." + secrets.token_urlsafe(16), "x" * 200]
    cookies = [
        *made_up,
        # Made for this session, but as a link, or under another key; a real cookie, of the other session.
        new_grant_value(keyed, LINK, label), new_grant_value(rekeyed, COOKIE, label), other_cookie,
    ]
    links = [*made_up, new_grant_value(keyed, COOKIE, label), new_grant_value(rekeyed, LINK, label)]
    with statements_run(db_connection) as statements:
        for value in cookies * 10:
            client.set_cookie("gpupool_session_grant", value)
            refused = client.get("/session-proxy/auth", headers=proxy)
            assert refused.status_code == 403 and refused.headers["X-Accel-Expires"] == "5"
        for value in links * 10:
            assert client.get(f"/session-proxy/open?link={value}", headers=proxy).status_code == 404
    assert statements == []
    # The other session's own cookie, at its own origin, is looked up.
    client.set_cookie("gpupool_session_grant", other_cookie)
    with statements_run(db_connection) as statements:
        answer = client.get("/session-proxy/auth", headers=other_proxy)
    assert answer.status_code in (204, 403) and answer.headers["X-Accel-Expires"] == "5" and statements


def test_two_grant_cookies_are_refused(client: FlaskClient, auth: dict[str, str]) -> None:
    """nginx answers such a request 400 before asking; the API, asked anyway, refuses it too."""
    job = submit_session(client, auth)
    label = label_of(client, auth, job["job_id"])
    proxy = {"X-Gpupool-Proxy-Key": PROXY_KEY, "X-Gpupool-Session": label}
    opened = client.get(f"/session-proxy/open?link={link_value(client, auth, job['job_id'])}", headers=proxy)
    cookie = opened.headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    # A client without a cookie jar of its own, to send the header as given.
    raw = client.application.test_client(use_cookies=False)
    both = {**proxy, "Cookie": f"gpupool_session_grant={cookie}; gpupool_session_grant={cookie}"}
    assert raw.get("/session-proxy/auth", headers=both).status_code == 403
    one = {**proxy, "Cookie": f"theme=dark; gpupool_session_grant={cookie}"}
    assert raw.get("/session-proxy/auth", headers=one).status_code in (204, 403)
