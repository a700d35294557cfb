"""The audit log: who changed an account's keys, members, alerts, webhooks and jobs, through which credential."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from tests.api.test_web import signed_in
from tests.conftest import bearer, wait_for_state

RECEIVER = "http://127.0.0.1:9/services/T0/B0/receiver-path-secret?token=query-secret"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.replace(webhook_allow_cidrs=("127.0.0.0/8",))


def audit_events(client: FlaskClient, headers: dict[str, str], **query: Any) -> dict[str, Any]:
    answer = client.get("/account/audit", headers=headers, query_string=query)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    return answer.get_json()


def test_an_account_admin_reads_who_changed_what_with_which_credential_and_no_secret(
    client: FlaskClient, auth: dict[str, str], account: str, settings: Settings
) -> None:
    made = client.post("/keys", headers=auth, json={"name": "ops", "scope": "admin", "expires_in_days": 7}).get_json()
    key = {"Authorization": f"Bearer {made['key']}"}
    assert client.put("/account/alerts", headers=key, json={"thresholds": [50, 90]}).status_code == 200
    assert client.put("/account/members/bob", headers=auth, json={"role": "viewer", "gpu_limit": 2}).status_code == 200
    hook = client.post("/webhooks", headers=auth, json={"url": RECEIVER, "events": ["job.ended"]}).get_json()
    assert client.delete(f"/webhooks/{hook['id']}", headers=auth).status_code == 204
    assert client.delete(f"/keys/{made['id']}", headers=auth).status_code == 204

    events = audit_events(client, auth)["events"]
    seen = [(e["action"], e["actor"], e["via"], e["target"]) for e in events]
    assert seen == [
        ("key.revoke", "alice", "token", made["id"]),
        ("webhook.delete", "alice", "token", hook["id"]),
        ("webhook.create", "alice", "token", hook["id"]),
        ("member.set", "alice", "token", "bob"),
        ("alerts.set", "alice", "key", account),
        ("key.create", "alice", "token", made["id"]),
    ]
    by_action = {e["action"]: e for e in events}
    assert by_action["alerts.set"]["credential"] == f"key:{made['id']}"
    assert by_action["alerts.set"]["details"] == {"thresholds": [50, 90]}
    assert by_action["member.set"]["details"] == {"role": "viewer", "gpu_limit": 2, "monthly_limit": None, "templates": None}
    assert by_action["key.create"]["details"]["scope"] == "admin"
    # The receiver's path and query may be its own secret (Slack's are): only the origin is kept.
    assert by_action["webhook.create"]["details"] == {"destination": "http://127.0.0.1:9", "events": "job.ended"}
    assert all(e["address"] == "127.0.0.1" and e["at"].endswith("Z") for e in events)
    shown = str(events)
    # gpk_<hex id>_<secret>: the secret may itself hold "_", so it is everything after the second one.
    for secret in (made["key"].split("_", 2)[2], hook["secret"], "receiver-path-secret", "query-secret"):
        assert secret not in shown

    first = audit_events(client, auth, limit=4)
    assert [e["action"] for e in first["events"]] == [action for action, *_ in seen[:4]]
    rest = audit_events(client, auth, limit=4, before=first["next_before"])
    assert [e["action"] for e in rest["events"]] == [action for action, *_ in seen[4:]] and rest["next_before"] is None
    refused = client.get("/account/audit?limit=x", headers=auth)
    assert refused.status_code == 400 and refused.get_json()["error"] == "bad_request"


def test_only_the_accounts_admins_read_its_log(
    client: FlaskClient, auth: dict[str, str], account: str, other_account: str, settings: Settings
) -> None:
    assert client.put("/account/members/vic", headers=auth, json={"role": "viewer"}).status_code == 200
    assert client.put("/account/members/max", headers=auth, json={"role": "member"}).status_code == 200
    for subject in ("vic", "max"):
        refused = client.get("/account/audit", headers=bearer(settings, account, sub=subject))
        assert refused.status_code == 403 and refused.get_json()["error"] == "role_insufficient"
    other = bearer(settings, other_account)
    assert audit_events(client, other)["events"] == []
    assert client.get(f"/account/audit?account={account}", headers=other).status_code == 404
    # An operator's admin token may read any account's.
    operator = bearer(settings, other_account, sub="ops", role="admin")
    assert [e["target"] for e in audit_events(client, operator, account=account)["events"]] == ["max", "vic"]


def test_cancels_and_page_sign_ins_are_recorded(client: FlaskClient, auth: dict[str, str], account: str, settings: Settings) -> None:
    submitted = client.post("/submit", headers=auth, json={"template": "hello", "gpus": 1, "params": {"seconds": 300}}).get_json()
    wait_for_state(client, submitted["job_id"], auth, {"PENDING", "RUNNING"})
    assert client.delete(f"/jobs/{submitted['job_id']}", headers=auth).status_code == 202
    signed_in(client.application.test_client(), settings, account, sub="carol")
    events = audit_events(client, auth)["events"]
    assert [(e["action"], e["actor"], e["via"]) for e in events] == [("signin", "carol", "page"), ("job.cancel", "alice", "token")]
    assert events[1]["target"] == submitted["job_id"]


def test_no_role_may_change_or_remove_an_audit_row(client: FlaskClient, auth: dict[str, str], session_factory: sessionmaker) -> None:
    assert client.put("/account/alerts", headers=auth, json={"thresholds": [70]}).status_code == 200
    with session_factory() as session:
        for statement in ("UPDATE audit_events SET actor = 'someone else'", "DELETE FROM audit_events", "TRUNCATE audit_events"):
            with pytest.raises(DBAPIError, match="audit_events is append-only"), session.begin_nested():
                session.execute(text(statement))
        assert session.execute(text("SELECT actor FROM audit_events")).scalars().all() == ["alice"]
