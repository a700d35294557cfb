"""The webhook event types and the OpenAPI document's webhooks section come from one list."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from api.event_schemas import EVENTS, validate_event
from api.openapi import openapi_document
from api.schemas import WebhookEventType
from gpupool.webhooks.events import ACCOUNT_EVENT_TYPES, EVENT_TYPES, JOB_EVENT_TYPES, OPERATOR_EVENT_TYPES


def test_every_event_type_is_accepted_at_registration_and_documented() -> None:
    assert get_args(WebhookEventType) == EVENT_TYPES == JOB_EVENT_TYPES + ACCOUNT_EVENT_TYPES
    # The operator's events are documented too, but no account's endpoint may ask for them.
    assert set(EVENTS) == set(EVENT_TYPES + OPERATOR_EVENT_TYPES)
    assert not set(OPERATOR_EVENT_TYPES) & set(EVENT_TYPES)
    document = openapi_document({})
    assert set(document["webhooks"]) == set(EVENT_TYPES + OPERATOR_EVENT_TYPES)
    for event, (model, _) in EVENTS.items():
        post = document["webhooks"][event]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model.__name__}"}
        assert model.__name__ in document["components"]["schemas"]
        (type_header,) = [p for p in post["parameters"] if p["name"] == "Gpupool-Event-Type"]
        assert type_header["schema"] == {"const": event}


def test_a_payload_field_the_document_does_not_show_is_refused() -> None:
    alert = {"account": "acme", "kind": "credit", "threshold": 80, "used": "0.84", "total": "1.00", "currency": "EUR", "period": "credit:1.00"}
    event = {"id": "evt_1", "type": "budget.threshold", "created_at": "2026-12-03T10:00:00.5Z", "data": {"alert": alert}}
    validate_event(event)
    with pytest.raises(ValidationError, match="secret_figure"):
        validate_event({**event, "data": {"alert": {**alert, "secret_figure": 1}}})
    with pytest.raises(ValidationError):
        validate_event({**event, "type": "job.idle"})  # a job.idle body needs its job and notice
