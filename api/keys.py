"""``/keys``: API keys customers create, list and revoke for their own account."""

from __future__ import annotations

import datetime as dt

from flask import Blueprint, Response, g, jsonify

from api.audit import audit
from api.context import app_state, db_session
from api.schemas import KeyCreate, KeyCreated, KeyList, KeyOut, json_object, request_body
from gpupool.api_keys import create_key, key_details, list_keys, require_key_manager, revoke_key
from gpupool.audit import KEY_CREATE, KEY_REVOKE
from gpupool.clock import utc_text
from gpupool.db import utcnow
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


@keys_bp.post("/keys")
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


@keys_bp.get("/keys")
def index() -> Response:
    require_key_manager(g.principal)
    listed = KeyList(keys=[_view(row) for row in list_keys(db_session(), g.principal)])
    return jsonify(listed.model_dump(mode="json"))


@keys_bp.delete("/keys/<key_id>")
def revoke(key_id: str) -> tuple[str, int]:
    require_key_manager(g.principal)
    session = db_session()
    row = revoke_key(session, g.principal, key_id, utcnow())
    audit(KEY_REVOKE, account=row.account, target=row.id)
    session.commit()
    return "", 204
