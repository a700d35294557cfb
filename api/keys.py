"""``/keys``: API keys customers create, list and revoke for their own account."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, g, jsonify, request

from api.context import app_state, db_session
from gpupool.api_keys import create_key, list_keys, require_key_manager, revoke_key
from gpupool.db import utcnow
from gpupool.errors import BadRequest
from gpupool.models.api_keys import ApiKey

keys_bp = Blueprint("keys", __name__)


def _view(row: ApiKey) -> dict[str, Any]:
    def stamp(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "id": row.id, "name": row.name, "scope": row.scope, "templates": row.templates,
        "created_at": stamp(row.created_at), "expires_at": stamp(row.expires_at),
        "last_used_at": stamp(row.last_used_at), "revoked": row.revoked_at is not None,
    }


@keys_bp.post("/keys")
def create() -> tuple[Response, int]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise BadRequest("send a JSON object")
    name, scope, days, templates = body.get("name"), body.get("scope", "read"), body.get("expires_in_days"), body.get("templates")
    if not isinstance(name, str) or not isinstance(scope, str):
        raise BadRequest("name and scope must be strings")
    if days is not None and (not isinstance(days, int) or isinstance(days, bool)):
        raise BadRequest("expires_in_days must be a whole number")
    if templates is not None and (not isinstance(templates, list) or not all(isinstance(t, str) for t in templates)):
        raise BadRequest("templates must be a list of template names")
    session = db_session()
    made = create_key(
        session, app_state().settings, g.principal, name=name, scope=scope, days=days,
        templates=templates, known_templates=set(app_state().templates), now=utcnow(),
    )
    session.commit()
    # The only time the secret is ever shown.
    return jsonify({**_view(made.row), "key": made.secret}), 201


@keys_bp.get("/keys")
def index() -> Response:
    require_key_manager(g.principal)
    return jsonify({"keys": [_view(row) for row in list_keys(db_session(), g.principal)]})


@keys_bp.delete("/keys/<key_id>")
def revoke(key_id: str) -> tuple[str, int]:
    require_key_manager(g.principal)
    session = db_session()
    revoke_key(session, g.principal, key_id, utcnow())
    session.commit()
    return "", 204
