"""``/keys``: API keys customers create, list and revoke for their own account."""

from __future__ import annotations

import datetime as dt

from flask import Blueprint, Response, g, jsonify

from api.audit import audit
from api.context import app_state, db_session
from api.routing import Reply, operation
from api.schemas import KeyCreate, KeyCreated, KeyList, KeyOut, json_object, request_body
from gpupool.api_keys import create_key, key_details, list_keys, require_key_manager, revoke_key
from gpupool.audit import KEY_CREATE, KEY_REVOKE
from gpupool.clock import utc_text
from gpupool.db import utcnow
from gpupool.members import ALL_ROLES, WRITERS
from gpupool.models.api_keys import ApiKey

keys_bp = Blueprint("keys", __name__)


def _view(row: ApiKey) -> KeyOut:
    def stamp(value: dt.datetime | None) -> str | None:
        return utc_text(value) if value is not None else None

    return KeyOut(
        id=row.id, name=row.name, scope=row.scope, templates=row.templates,  # type: ignore[arg-type]
        created_at=utc_text(row.created_at), expires_at=utc_text(row.expires_at),
        last_used_at=stamp(row.last_used_at), revoked=row.revoked_at is not None,
    )


@operation(
    keys_bp, "POST", "/keys", roles=WRITERS, summary="Create an API key; its secret is in this answer only",
    request=KeyCreate, replies={"201": Reply("Created", KeyCreated)}, errors=(400, 403, 415, 422),
)
def create() -> tuple[Response, int]:
    # A key that may not make keys hears so whatever it sends.
    require_key_manager(g.principal)
    body = request_body(KeyCreate, json_object())
    session = db_session()
    made = create_key(
        session, app_state().settings, g.principal, name=body.name, scope=body.scope, days=body.expires_in_days,
        templates=body.templates, known_templates=set(app_state().templates), now=utcnow(),
    )
    audit(KEY_CREATE, account=made.row.account, target=made.row.id, details=key_details(made.row))
    session.commit()
    # The only time the secret is ever shown.
    created = KeyCreated(**_view(made.row).model_dump(), key=made.secret)
    return jsonify(created.model_dump(mode="json")), 201


@operation(
    keys_bp, "GET", "/keys", roles=ALL_ROLES, summary="The account's API keys (without secrets)",
    replies={"200": Reply("Keys", KeyList)}, errors=(403,),
)
def index() -> Response:
    require_key_manager(g.principal)
    listed = KeyList(keys=[_view(row) for row in list_keys(db_session(), g.principal)])
    return jsonify(listed.model_dump(mode="json"))


@operation(
    keys_bp, "DELETE", "/keys/<key_id>", roles=ALL_ROLES, summary="Revoke a key at once",
    parameters=[{"name": "key_id", "in": "path", "required": True, "schema": {"type": "string"}}],
    replies={"204": Reply("Revoked")}, errors=(403, 404),
)
def revoke(key_id: str) -> tuple[str, int]:
    require_key_manager(g.principal)
    session = db_session()
    row = revoke_key(session, g.principal, key_id, utcnow())
    audit(KEY_REVOKE, account=row.account, target=row.id)
    session.commit()
    return "", 204
