"""The Keys and Members pages: the API's own rules, through the session cookie and its forms."""

from __future__ import annotations

import re

from flask.testing import FlaskClient

from gpupool.config import Settings
from tests.api.test_web import csrf_of, signed_in
from tests.conftest import bearer

SECRET = re.compile(r'<pre id="new-key-secret">(gpk_[^<]+)</pre>')


def test_a_key_made_on_the_page_is_shown_once_works_and_is_revoked_there(
    client: FlaskClient, settings: Settings, account: str
) -> None:
    signed_in(client, settings, account)
    page = client.get("/ui/keys")
    assert page.status_code == 200 and "No keys yet." in page.get_data(as_text=True)
    made = client.post("/ui/keys", data={"csrf_token": csrf_of(page), "name": "ci", "scope": "read", "expires_in_days": "7"})
    assert made.status_code == 201
    assert made.headers["Cache-Control"].startswith("private, no-store")
    (secret,) = SECRET.findall(made.get_data(as_text=True))
    key = {"Authorization": f"Bearer {secret}"}
    assert client.get("/jobs", headers=key).status_code == 200
    listing = client.get("/ui/keys").get_data(as_text=True)
    assert secret not in listing and ">ci<" in listing  # never shown again
    key_id = secret.split("_")[1]
    revoked = client.post(f"/ui/keys/{key_id}/revoke", data={"csrf_token": csrf_of(made)})
    assert revoked.status_code == 303
    assert client.get("/jobs", headers=key).status_code == 401
    refused = client.post("/ui/keys", data={"csrf_token": csrf_of(made), "name": "x", "scope": "root"})
    assert refused.status_code == 422 and "scope must be one of" in refused.get_data(as_text=True)


def test_the_members_page_adds_members_for_admins_only(client: FlaskClient, settings: Settings, account: str, app: object) -> None:
    signed_in(client, settings, account, sub="ada")
    page = client.get("/ui/members")
    assert page.status_code == 200
    added = client.post(
        "/ui/members", data={"csrf_token": csrf_of(page), "subject": "bob", "role": "member", "gpu_limit": "2", "monthly_limit": "10.00"}
    )
    assert added.status_code == 303
    listed = client.get("/account/members", headers=bearer(settings, account, sub="ada")).get_json()["members"]
    assert [(m["subject"], m["role"], m["gpu_limit"], m["monthly_limit"]) for m in listed] == [
        ("ada", "admin", None, None), ("bob", "member", 2, "10.00"),
    ]
    # Bob signs in on his own client: the members page is not his; his keys page shows his keys alone.
    bobs = signed_in(client.application.test_client(), settings, account, sub="bob")  # type: ignore[attr-defined]
    assert bobs.get("/ui/members").status_code == 403
    client.post("/keys", headers=bearer(settings, account, sub="ada"), json={"name": "adas-key"})
    assert "adas-key" not in bobs.get("/ui/keys").get_data(as_text=True)
    assert "adas-key" in client.get("/ui/keys").get_data(as_text=True)
