"""Webhook endpoints of the caller's account, and what was delivered to them (gpupool.webhooks sends)."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, Response, jsonify, request, url_for
from sqlalchemy import select

from api.audit import audit
from api.context import app_state, db_session, principal
from api.query import int_arg, int_param
from api.routing import Reply, operation
from api.schemas import (
    DeliveryAttemptOut,
    DeliveryList,
    DeliveryOut,
    WebhookCreate,
    WebhookCreated,
    WebhookList,
    WebhookOut,
    json_object,
    request_body,
)
from gpupool.audit import WEBHOOK_CREATE, WEBHOOK_DELETE
from gpupool.config import allowed_networks
from gpupool.db import utcnow
from gpupool.errors import BadRequest, Conflict, NotFound
from gpupool.members import ADMINS
from gpupool.models.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
from gpupool.webhooks.destinations import check_destination, url_origin
from gpupool.webhooks.endpoints import new_secret

webhooks_bp = Blueprint("webhooks", __name__)

# Each endpoint multiplies every event into one more delivery; a handful is plenty.
MAX_ENDPOINTS_PER_ACCOUNT = 20
MAX_DELIVERY_PAGE = 100
# Delivery ids are BIGINTs: 18 digits always fit, and a longer cursor was never issued.
MAX_CURSOR_DIGITS = 18
_ENDPOINT_ID = {"name": "endpoint_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}


def _endpoint_view(endpoint: WebhookEndpoint) -> dict[str, Any]:
    return WebhookOut(
        id=endpoint.id, url=endpoint.url, events=endpoint.events.split(","), created_at=endpoint.created_at
    ).model_dump(mode="json")


def _create_request() -> WebhookCreate:
    return request_body(WebhookCreate, json_object())


def _own_endpoint(endpoint_id: str) -> WebhookEndpoint:
    endpoint = db_session().get(WebhookEndpoint, endpoint_id) if len(endpoint_id) <= 36 else None
    if endpoint is None or endpoint.account != principal().account or endpoint.deleted_at is not None:
        raise NotFound(f"no webhook {endpoint_id!r} in your account")
    return endpoint


@operation(
    webhooks_bp, "POST", "/webhooks", roles=ADMINS,
    summary="Register a webhook endpoint; its signing secret is in this answer only",
    description="The URL's host is resolved now: loopback, private, link-local and metadata addresses are refused "
    "(422 webhook_url_refused) unless the operator allowlists them; nothing is sent.",
    request=WebhookCreate, replies={"201": Reply("Registered", WebhookCreated)}, errors=(400, 409, 415, 422),
)
def create_webhook() -> tuple[Response, int, dict[str, str]]:
    wanted = _create_request()
    # Resolved and refused here, before anything is stored and without sending a byte.
    check_destination(wanted.url, allowed_networks(app_state().settings.webhook_allow_cidrs, "webhook_allow_cidrs"))
    session = db_session()
    account = principal().account
    active = session.scalars(
        select(WebhookEndpoint.id).where(
            WebhookEndpoint.account == account, WebhookEndpoint.deleted_at.is_(None), WebhookEndpoint.job_id.is_(None)
        )
    ).all()
    if len(active) >= MAX_ENDPOINTS_PER_ACCOUNT:
        raise Conflict(f"an account may have at most {MAX_ENDPOINTS_PER_ACCOUNT} webhooks; delete one first", code="too_many_webhooks")
    endpoint = WebhookEndpoint(
        id=str(uuid.uuid4()),
        account=account,
        url=wanted.url,
        events=",".join(dict.fromkeys(wanted.events)),
        secret=new_secret(),
        created_at=utcnow(),
    )
    session.add(endpoint)
    audit(WEBHOOK_CREATE, account=account, target=endpoint.id, details={"destination": url_origin(wanted.url), "events": endpoint.events})
    session.commit()
    created = WebhookCreated(**_endpoint_view(endpoint), secret=endpoint.secret).model_dump(mode="json")
    return jsonify(created), 201, {"Location": url_for("webhooks.list_deliveries", endpoint_id=endpoint.id)}


@operation(
    webhooks_bp, "GET", "/webhooks", roles=ADMINS, summary="The account's webhook endpoints (without secrets)",
    replies={"200": Reply("Endpoints", WebhookList)},
)
def list_webhooks() -> Response:
    endpoints = db_session().scalars(
        select(WebhookEndpoint)
        .where(
            WebhookEndpoint.account == principal().account,
            WebhookEndpoint.deleted_at.is_(None),
            WebhookEndpoint.job_id.is_(None),
        )
        .order_by(WebhookEndpoint.created_at)
    )
    return jsonify({"webhooks": [_endpoint_view(endpoint) for endpoint in endpoints]})


@operation(
    webhooks_bp, "DELETE", "/webhooks/<endpoint_id>", roles=ADMINS,
    summary="Stop sending to an endpoint; deliveries not yet made are cancelled",
    parameters=[_ENDPOINT_ID], replies={"204": Reply("Deleted")}, errors=(404,),
)
def delete_webhook(endpoint_id: str) -> tuple[str, int]:
    endpoint = _own_endpoint(endpoint_id)
    endpoint.deleted_at = utcnow()  # kept, so its deliveries' history stays readable in the database
    audit(WEBHOOK_DELETE, account=principal().account, target=endpoint.id)  # _own_endpoint: the same
    db_session().commit()
    return "", 204


def _cursor_id() -> int | None:
    raw = request.args.get("cursor")
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > MAX_CURSOR_DIGITS:
        raise BadRequest("cursor is not one this API issued")
    return int(raw)


@operation(
    webhooks_bp, "GET", "/webhooks/<endpoint_id>/deliveries", roles=ADMINS,
    summary="Events owed to an endpoint, newest first, with every attempt and the receiver's answers",
    parameters=[
        _ENDPOINT_ID,
        int_param("limit", 1, MAX_DELIVERY_PAGE),
        {"name": "cursor", "in": "query", "schema": {"type": "string", "pattern": f"^[0-9]{{1,{MAX_CURSOR_DIGITS}}}$"}},
    ],
    replies={"200": Reply("Deliveries", DeliveryList)}, errors=(400, 404),
)
def list_deliveries(endpoint_id: str) -> Response:
    endpoint = _own_endpoint(endpoint_id)
    session = db_session()
    limit = int_arg("limit", 50, 1, MAX_DELIVERY_PAGE)
    query = (
        select(WebhookDelivery, WebhookEvent)
        .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.endpoint_id == endpoint.id)
    )
    before = _cursor_id()
    if before is not None:
        query = query.where(WebhookDelivery.id < before)
    rows = session.execute(query.order_by(WebhookDelivery.id.desc()).limit(limit + 1)).all()
    page, more = rows[:limit], len(rows) > limit
    attempts: dict[int, list[DeliveryAttemptOut]] = {delivery.id: [] for delivery, _ in page}
    for attempt in session.scalars(
        select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(list(attempts))).order_by(WebhookAttempt.id)
    ):
        attempts[attempt.delivery_id].append(DeliveryAttemptOut.model_validate(attempt, from_attributes=True))
    deliveries = [
        DeliveryOut(
            event_id=event.id,
            event_type=event.type,
            job_id=event.job_id,
            state=delivery.state,
            attempts=attempts[delivery.id],
            next_attempt_at=delivery.next_attempt_at if delivery.state == "pending" else None,
            delivered_at=delivery.delivered_at,
            payload=event.payload,
        ).model_dump(mode="json")
        for delivery, event in page
    ]
    return jsonify({"deliveries": deliveries, "next_cursor": str(page[-1][0].id) if more else None})
