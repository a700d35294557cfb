"""API keys customers create: shown once, stored hashed, scoped, revocable, expiring."""

from __future__ import annotations

import datetime as dt
from typing import Any

from flask.testing import FlaskClient
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from api.auth import TEMPLATE_ENDPOINTS
from gpupool.config import Settings
from gpupool.models import ApiKey
from tests.conftest import bearer


def make_key(client: FlaskClient, auth: dict[str, str], **body: Any) -> dict[str, Any]:
    response = client.post("/keys", headers=auth, json={"name": "ci", **body})
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()


def key_auth(made: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {made['key']}"}


def test_a_key_is_shown_once_and_stored_only_as_a_hash(client: FlaskClient, auth: dict[str, str], session_factory: sessionmaker) -> None:
    made = make_key(client, auth, scope="read")
    secret = made["key"].split("_", 2)[2]
    assert made["key"].startswith(f"gpk_{made['id']}_")
    listed = client.get("/keys", headers=auth).get_json()["keys"]
    assert [k["id"] for k in listed] == [made["id"]]
    assert "key" not in listed[0]
    with session_factory() as session:
        row = session.execute(text("SELECT * FROM api_keys WHERE id = :id"), {"id": made["id"]}).mappings().one()
    assert not any(secret in str(value) for value in row.values())


def test_a_read_key_reads_but_cannot_submit_or_make_keys(client: FlaskClient, auth: dict[str, str]) -> None:
    headers = key_auth(make_key(client, auth, scope="read"))
    assert client.get("/jobs", headers=headers).status_code == 200
    refused = client.post("/submit", headers=headers, json={"template": "hello"})
    assert refused.status_code == 403
    assert refused.get_json()["error"] == "scope_insufficient"
    assert client.post("/keys", headers=headers, json={"name": "x"}).status_code == 403


def test_a_submit_key_cannot_manage_keys_and_templates_limit_it(client: FlaskClient, auth: dict[str, str]) -> None:
    headers = key_auth(make_key(client, auth, scope="submit", templates=["hello"]))
    assert client.get("/keys", headers=headers).status_code == 403
    refused = client.post("/submit", headers=headers, json={"template": "envdump"})
    assert refused.status_code == 403
    assert refused.get_json()["error"] == "template_not_allowed"
    # Its own template goes through to the submit's checks, as the creator's token does.
    quote = {"template": "hello", "gpus": 1}
    by_key = client.post("/submit?dry_run=true", headers=headers, json=quote)
    by_token = client.post("/submit?dry_run=true", headers=auth, json=quote)
    assert by_key.status_code == by_token.status_code and by_key.status_code not in (401, 403), by_key.get_data(as_text=True)


def test_the_template_limit_covers_every_endpoint_that_takes_a_template(client: FlaskClient) -> None:
    taking_a_template = {rule.endpoint for rule in client.application.url_map.iter_rules() if rule.rule in ("/submit", "/quote")}
    assert TEMPLATE_ENDPOINTS == taking_a_template


def test_last_use_shows_after_a_request(client: FlaskClient, auth: dict[str, str]) -> None:
    made = make_key(client, auth, scope="read")
    assert client.get("/keys", headers=auth).get_json()["keys"][0]["last_used_at"] is None
    client.get("/jobs", headers=key_auth(made))
    assert client.get("/keys", headers=auth).get_json()["keys"][0]["last_used_at"] is not None


def test_a_revoked_key_gets_401(client: FlaskClient, auth: dict[str, str]) -> None:
    made = make_key(client, auth, scope="admin")
    assert client.delete(f"/keys/{made['id']}", headers=auth).status_code == 204
    refused = client.get("/jobs", headers=key_auth(made))
    assert refused.status_code == 401
    assert refused.get_json() == {"error": "key_revoked", "message": "the API key has been revoked"}


def test_an_expired_key_gets_401(client: FlaskClient, auth: dict[str, str], session_factory: sessionmaker) -> None:
    made = make_key(client, auth, scope="read", expires_in_days=1)
    with session_factory() as session, session.begin():
        row = session.get(ApiKey, made["id"])
        assert row is not None
        row.expires_at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    assert client.get("/jobs", headers=key_auth(made)).get_json()["error"] == "key_expired"


def test_a_wrong_secret_or_a_too_long_expiry_is_refused(client: FlaskClient, auth: dict[str, str], settings: Settings) -> None:
    made = make_key(client, auth)
    forged = {"Authorization": f"Bearer gpk_{made['id']}_{'A' * 43}"}
    assert client.get("/jobs", headers=forged).status_code == 401
    too_long = client.post("/keys", headers=auth, json={"name": "x", "expires_in_days": settings.api_key_max_days + 1})
    assert too_long.status_code == 422


def test_a_key_sees_and_revokes_only_its_own_account(
    client: FlaskClient, auth: dict[str, str], settings: Settings, other_account: str
) -> None:
    other = bearer(settings, other_account, sub="eve")
    theirs = make_key(client, other, scope="admin")
    mine = key_auth(make_key(client, auth, scope="admin"))
    assert client.delete(f"/keys/{theirs['id']}", headers=mine).status_code == 404
    assert [k["id"] for k in client.get("/keys", headers=mine).get_json()["keys"]] != [theirs["id"]]
    assert client.get("/jobs", headers=mine).get_json()["jobs"] == []


def test_a_key_body_must_be_json_and_valid(client: FlaskClient, auth: dict[str, str]) -> None:
    as_form = client.post("/keys", headers=auth, data="name=ci")
    assert as_form.status_code == 415
    assert as_form.get_json()["error"] == "unsupported_media_type"
    bad_scope = client.post("/keys", headers=auth, json={"name": "ci", "scope": "root"})
    assert bad_scope.status_code == 422
    assert bad_scope.get_json()["error"] == "validation_failed" and "scope" in bad_scope.get_json()["message"]
    assert make_key(client, auth)["created_at"].endswith("Z")
