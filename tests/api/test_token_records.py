"""A token's record is the authority: claims that differ from what was issued for its jti get 401."""

from __future__ import annotations

from typing import Any

import jwt
import pytest
from flask.testing import FlaskClient

from gpupool.config import Settings
from tests.conftest import recorded_token

UNKNOWN = {"error": "token_unknown", "message": "the token was not issued by this service; ask the operator for a new one"}


def claims_of(token: str) -> dict[str, Any]:
    return jwt.decode(token, options={"verify_signature": False})


def resigned(settings: Settings, token: str, **changes: Any) -> dict[str, str]:
    """``token``'s claims with ``changes``, signed with the service's own key: what a leaked key would allow."""
    forged = jwt.encode({**claims_of(token), **changes}, settings.jwt_secret, algorithm=settings.jwt_algorithm)
    return {"Authorization": f"Bearer {forged}"}


@pytest.mark.parametrize(
    "changes",
    [{"role": "admin"}, {"sub": "mallory"}, {"exp_shift_s": 86_400}],
    ids=["role", "subject", "expiry"],
)
def test_a_recorded_jti_with_other_claims_gets_401(
    client: FlaskClient, settings: Settings, account: str, changes: dict[str, Any]
) -> None:
    token = recorded_token(settings, account)
    assert client.get("/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    if "exp_shift_s" in changes:
        changes = {"exp": claims_of(token)["exp"] + changes.pop("exp_shift_s")}
    forged = resigned(settings, token, **changes)
    for path in ("/jobs", "/admin/report?period=2026-11"):
        reply = client.get(path, headers=forged)
        assert reply.status_code == 401, reply.get_data(as_text=True)
        assert reply.get_json() == UNKNOWN
    # The genuine token is untouched.
    assert client.get("/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_an_admin_record_still_admits_its_own_token(client: FlaskClient, settings: Settings, account: str) -> None:
    admin = recorded_token(settings, account, sub="ops", role="admin")
    assert client.get("/admin/report?period=2026-11", headers={"Authorization": f"Bearer {admin}"}).status_code == 200
    demoted = resigned(settings, admin, role="customer")  # even claiming less than issued is not what was issued
    assert client.get("/jobs", headers=demoted).get_json() == UNKNOWN
