"""The OpenAPI 3.1 document: the operations the routes declared (api.routing), and the pydantic models they name."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import gpupool
from api.event_schemas import EVENTS, event_models
from api.routing import OPERATIONS, SCHEMA_REF, json_content
from api.schemas import ErrorOut
from gpupool.templates import Template


def _schemas(*models: type[BaseModel]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=SCHEMA_REF)
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


_SIGNATURE_DESCRIPTION = (
    "t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<raw body>\" keyed by the endpoint's secret>. "
    "Reject deliveries whose t is more than 5 minutes off; gpupool_client.verify_signature does both checks."
)


def _webhook_events() -> dict[str, Any]:
    """OpenAPI 3.1 ``webhooks``: what gpupool POSTs to registered endpoints and callback URLs (api.event_schemas)."""
    answer = {"2XX": {"description": "Received; any other answer, or none within the timeout, is retried with backoff for 24 h"}}
    documented = {}
    for event, (model, summary) in EVENTS.items():
        headers = [
            {"name": "Gpupool-Signature", "in": "header", "required": True, "schema": {"type": "string"}, "description": _SIGNATURE_DESCRIPTION},
            {"name": "Gpupool-Event-Id", "in": "header", "required": True, "schema": {"type": "string"}, "description": "The event's id, also in the body: deduplicate on it (delivery is at least once)"},
            {"name": "Gpupool-Event-Type", "in": "header", "required": True, "schema": {"const": event}},
        ]
        documented[event] = {
            "post": {
                "summary": summary,
                "parameters": headers,
                "requestBody": {"required": True, "content": json_content(model)},
                "responses": answer,
            }
        }
    return documented


def _only_templates(prop: dict[str, Any], names: list[str]) -> None:
    """A list of template names (maybe nullable): each item one of the operator's templates."""
    for option in prop.get("anyOf", [prop]):
        if option.get("type") == "array":
            option["items"] = {**option.get("items", {}), "enum": names}


def _component_schemas(templates: dict[str, Template]) -> dict[str, Any]:
    """Every model an operation or an event names, with the operator's templates as the only valid names."""
    named = dict.fromkeys(model for documented in OPERATIONS.values() for model in documented.models)
    schemas = _schemas(*named, ErrorOut, *event_models())
    # pydantic checks the shape, the app the name.
    schemas["SubmitRequest"]["properties"]["template"]["enum"] = sorted(templates)
    for model in ("KeyCreate", "MemberIn"):
        _only_templates(schemas[model]["properties"]["templates"], sorted(templates))
    for template in templates.values():
        schemas[template.params_model.__name__] = template.parameter_schema()
    return schemas


def _paths() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for (path, method), documented in OPERATIONS.items():
        paths.setdefault(path, {})[method] = documented.document()
    return paths


def openapi_document(templates: dict[str, Template]) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpupool", "version": gpupool.__version__},
        "components": {
            "schemas": _component_schemas(templates),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
        "webhooks": _webhook_events(),
    }
