"""Each API route is declared once with its roles and its document (api.routing): what that guarantees."""

from __future__ import annotations

import pytest
from flask import Blueprint, Flask
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from api.routing import Reply, RouteDeclarationError, operation, require_every_route_declared
from gpupool.config import Settings
from gpupool.db import utcnow
from gpupool.models.members import AccountMember
from gpupool.tokens import issue_token
from tests.app.conftest import ACCOUNT


def test_a_route_made_without_its_declaration_is_refused_when_the_app_is_built() -> None:
    app = Flask("undeclared", static_folder=None)
    rogue = Blueprint("rogue", __name__)
    rogue.add_url_rule("/rogue", "rogue", lambda: "")
    app.register_blueprint(rogue)
    with pytest.raises(RouteDeclarationError, match="/rogue"):
        require_every_route_declared(app, exempt_blueprints=(), exempt_endpoints=())


def test_a_route_without_roles_or_answers_cannot_be_declared() -> None:
    rogue = Blueprint("rogue_roles", __name__)
    with pytest.raises(RouteDeclarationError, match="roles"):
        operation(rogue, "GET", "/rogue", roles=frozenset(), summary="Nobody", replies={"200": Reply("Ok")})(lambda: "")
    with pytest.raises(RouteDeclarationError, match="roles"):
        operation(rogue, "GET", "/rogue", roles=frozenset({"owner"}), summary="Not a role", replies={"200": Reply("Ok")})(lambda: "")
    with pytest.raises(RouteDeclarationError, match="answers"):
        operation(rogue, "GET", "/rogue", roles=frozenset({"admin"}), summary="No answers", replies={})
    # A second declaration of a documented path and method would hide one of the two.
    with pytest.raises(RouteDeclarationError, match="declared twice"):
        operation(rogue, "GET", "/jobs/<job_id>", roles=frozenset({"admin"}), summary="Again", replies={"200": Reply("Ok")})(lambda: "")


def test_the_roles_declared_with_a_route_are_the_ones_enforced(
    client: FlaskClient, settings: Settings, session_factory: sessionmaker
) -> None:
    now = utcnow()
    with session_factory() as session, session.begin():
        for subject, role in (("ada", "admin"), ("vic", "viewer")):
            session.add(AccountMember(account=ACCOUNT, subject=subject, role=role, created_at=now, updated_at=now))
        vic = {"Authorization": "Bearer " + issue_token(session, settings, sub="vic", account=ACCOUNT, role="customer", ttl_s=3600)}
    assert client.get("/jobs", headers=vic).status_code == 200
    refused = client.get("/account/members", headers=vic)
    assert (refused.status_code, refused.get_json()["error"]) == (403, "role_insufficient")
    assert "admin" in refused.get_json()["message"]
