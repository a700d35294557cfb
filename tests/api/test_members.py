"""People inside an account: roles (admin, member, viewer), their own limits, and what each may see."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from billing.calendar import period_of
from billing.prices import set_price
from gpupool.config import Settings
from tests.conftest import SUITE_NOW, bearer

SHORT_JOB = {"template": "hello", "gpus": 1, "time_limit_min": 60, "params": {"seconds": 120}}


@pytest.fixture
def people(client: FlaskClient, settings: Settings, account: str) -> dict[str, dict[str, str]]:
    """ada (admin: she adds the account's first members, which enrolls her), bob (at most 1 GPU), carol, vic (viewer)."""
    tokens = {name: bearer(settings, account, sub=name) for name in ("ada", "bob", "carol", "vic", "dave")}
    for subject, body in (
        ("bob", {"role": "member", "gpu_limit": 1}),
        ("carol", {"role": "member"}),
        ("vic", {"role": "viewer"}),
    ):
        answer = client.put(f"/account/members/{subject}", headers=tokens["ada"], json=body)
        assert answer.status_code == 200, answer.get_data(as_text=True)
    return tokens


def submit(client: FlaskClient, headers: dict[str, str], **changes: Any) -> Any:
    return client.post("/submit", headers=headers, json={**SHORT_JOB, **changes})


def test_the_first_member_enrolls_the_admin_who_added_them(client: FlaskClient, people: dict[str, dict[str, str]]) -> None:
    listed = client.get("/account/members", headers=people["ada"]).get_json()["members"]
    assert [(m["subject"], m["role"], m["gpu_limit"]) for m in listed] == [
        ("ada", "admin", None), ("bob", "member", 1), ("carol", "member", None), ("vic", "viewer", None),
    ]
    # Once the account has members, a subject it does not list is refused, however valid its token.
    refused = client.get("/jobs", headers=people["dave"])
    assert refused.status_code == 403
    assert refused.get_json()["error"] == "not_a_member"


def test_a_member_at_their_gpu_limit_gets_402_while_another_member_submits(
    client: FlaskClient, people: dict[str, dict[str, str]]
) -> None:
    first = submit(client, people["bob"])
    assert first.status_code == 201, first.get_json()
    second = submit(client, people["bob"])
    assert second.status_code == 402
    body = second.get_json()
    assert (body["error"], body["limit"], body["in_use"], body["asked"]) == ("member_gpu_limit", 1, 1, 1)
    assert "at most 1 GPU(s)" in body["message"]
    assert submit(client, people["carol"]).status_code == 201
    # Cancelling his job frees his GPU: the limit counts unfinished jobs, as the member sees them.
    assert client.delete(f"/jobs/{first.get_json()['job_id']}", headers=people["bob"]).status_code == 202
    shown = client.get("/account/members", headers=people["ada"]).get_json()["members"]
    assert {m["subject"]: m["gpus_in_flight"] for m in shown}["carol"] == 1


def test_members_see_only_their_own_jobs_and_viewers_read_without_logs(
    client: FlaskClient, people: dict[str, dict[str, str]]
) -> None:
    bobs = submit(client, people["bob"]).get_json()["job_id"]
    carols = submit(client, people["carol"]).get_json()["job_id"]
    assert [j["job_id"] for j in client.get("/jobs", headers=people["bob"]).get_json()["jobs"]] == [bobs]
    for path in (f"/jobs/{carols}", f"/jobs/{carols}/logs"):
        hidden = client.get(path, headers=people["bob"])
        assert hidden.status_code == 404, path
    assert client.delete(f"/jobs/{carols}", headers=people["bob"]).status_code == 404
    assert client.get(f"/jobs/{bobs}/logs", headers=people["bob"]).status_code == 200
    assert client.get(f"/jobs/{bobs}/logs", headers=people["ada"]).status_code == 200

    viewer = people["vic"]
    assert {j["job_id"] for j in client.get("/jobs", headers=viewer).get_json()["jobs"]} == {bobs, carols}
    assert client.get(f"/jobs/{carols}", headers=viewer).status_code == 200
    for refused in (
        client.get(f"/jobs/{carols}/logs", headers=viewer),
        submit(client, viewer),
        client.delete(f"/jobs/{carols}", headers=viewer),
    ):
        assert refused.status_code == 403
        assert refused.get_json()["error"] == "role_insufficient"
    period = period_of(SUITE_NOW)
    assert client.get(f"/invoices/{period}", headers=viewer).status_code == 200
    assert client.get("/usage", headers=people["bob"]).status_code == 200
    member_invoice = client.get(f"/invoices/{period}", headers=people["bob"])
    assert (member_invoice.status_code, member_invoice.get_json()["error"]) == (403, "role_insufficient")
    assert client.put("/account/members/bob", headers=people["bob"], json={"role": "admin"}).status_code == 403


def test_an_account_keeps_an_admin(client: FlaskClient, people: dict[str, dict[str, str]]) -> None:
    for answer in (
        client.delete("/account/members/ada", headers=people["ada"]),
        client.put("/account/members/ada", headers=people["ada"], json={"role": "member"}),
    ):
        assert answer.status_code == 409
        assert answer.get_json()["error"] == "last_admin"
    assert client.put("/account/members/carol", headers=people["ada"], json={"role": "admin"}).status_code == 200
    assert client.delete("/account/members/ada", headers=people["ada"]).status_code == 204
    assert client.get("/jobs", headers=people["carol"]).status_code == 200
    # A bad body is a 422 naming the field; an unknown field a 400.
    bad = client.put("/account/members/bob", headers=people["carol"], json={"role": "owner"})
    assert bad.status_code == 422 and "role" in bad.get_json()["message"]
    assert client.put("/account/members/bob", headers=people["carol"], json={"role": "member", "x": 1}).status_code == 400


def test_a_members_key_acts_as_that_member(client: FlaskClient, people: dict[str, dict[str, str]]) -> None:
    too_much = client.post("/keys", headers=people["bob"], json={"name": "ci", "scope": "admin"})
    assert (too_much.status_code, too_much.get_json()["error"]) == (403, "scope_insufficient")
    made = client.post("/keys", headers=people["bob"], json={"name": "ci", "scope": "submit"})
    assert made.status_code == 201
    key = {"Authorization": f"Bearer {made.get_json()['key']}"}
    adas = client.post("/keys", headers=people["ada"], json={"name": "ops", "scope": "read"}).get_json()
    assert submit(client, key).status_code == 201
    limited = submit(client, key)
    assert (limited.status_code, limited.get_json()["error"]) == (402, "member_gpu_limit")
    assert [k["name"] for k in client.get("/keys", headers=people["bob"]).get_json()["keys"]] == ["ci"]
    assert sorted(k["name"] for k in client.get("/keys", headers=people["ada"]).get_json()["keys"]) == ["ci", "ops"]
    assert client.delete(f"/keys/{adas['id']}", headers=people["bob"]).status_code == 404
    # Taken out of the account, bob's key stops at once (keys are read on every request).
    assert client.delete("/account/members/bob", headers=people["ada"]).status_code == 204
    gone = client.get("/jobs", headers=key)
    assert (gone.status_code, gone.get_json()["error"]) == (403, "not_a_member")


def test_a_members_monthly_limit_is_402_for_them_alone(
    client: FlaskClient, people: dict[str, dict[str, str]], session_factory: sessionmaker
) -> None:
    with session_factory() as session, session.begin():
        set_price(session, "rtx4090", 120_000, SUITE_NOW - dt.timedelta(days=400))
    assert client.put("/account/members/carol", headers=people["ada"], json={"role": "member", "monthly_limit": "0.40"}).status_code == 200
    # 1 GPU x 60 min x 0.00012 per GPU-second = 0.432 > 0.40.
    refused = submit(client, people["carol"])
    assert refused.status_code == 402
    body = refused.get_json()
    assert (body["error"], body["limit"], body["required"], body["spent_this_month"]) == ("member_budget", "0.40", "0.432", "0.00")
    assert submit(client, people["carol"], time_limit_min=30).status_code == 201  # 0.216 fits
    assert submit(client, people["carol"], time_limit_min=30).status_code == 402  # and a second does not
    assert submit(client, people["bob"], time_limit_min=30).status_code == 201
