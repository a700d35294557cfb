"""Service-level resources: health, readiness, templates and the OpenAPI document."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from api.context import app_state
from api.errors import error_response
from api.openapi import openapi_document
from api.routing import PUBLIC, Reply, operation
from api.schemas import TemplateList, TemplateOut
from gpupool.db import read_only_reason
from gpupool.errors import ServiceUnavailable
from gpupool.members import ALL_ROLES

meta_bp = Blueprint("meta", __name__)
templates_bp = Blueprint("templates", __name__)


@operation(meta_bp, "GET", "/healthz", roles=PUBLIC, summary="The process is up", replies={"200": Reply("Up")})
def healthz() -> Response:
    return jsonify({"status": "ok"})


@operation(
    meta_bp, "GET", "/readyz", roles=PUBLIC, summary="Slurm and the database answer", replies={"200": Reply("Ready")}, errors=(503,)
)
def readyz() -> Response:
    app = app_state()
    checks: dict[str, str] = {}
    try:
        with app.session_factory() as session:
            read_only = read_only_reason(session)
        # A host that takes no writes serves no submit: a load balancer should stop sending here.
        checks["database"] = "ok" if read_only is None else f"unavailable: {read_only}"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        checks["database"] = f"unavailable: {type(exc).__name__}"
    try:
        app.slurm_ping.get()
        checks["slurm"] = "ok"
    except ServiceUnavailable as exc:
        checks["slurm"] = f"unavailable: {exc.message}"
    if all(value == "ok" for value in checks.values()):
        return jsonify({"status": "ready", "checks": checks})
    failing = ", ".join(name for name, value in checks.items() if value != "ok")
    return error_response(503, "not_ready", f"not ready: {failing} not answering", checks=checks)


@operation(meta_bp, "GET", "/openapi.json", roles=PUBLIC, summary="This document", replies={"200": Reply("OpenAPI 3.1")})
def openapi() -> Response:
    return jsonify(openapi_document(app_state().templates))


@operation(
    templates_bp, "GET", "/templates", roles=ALL_ROLES, summary="Templates and their parameter schemas",
    replies={"200": Reply("Templates", TemplateList)},
)
def list_templates() -> Response:
    return jsonify(
        {
            "templates": [
                TemplateOut(
                    name=t.name,
                    description=t.description,
                    min_gpus=t.min_gpus,
                    max_gpus=t.max_gpus,
                    default_gpus=t.default_gpus,
                    params_schema=t.parameter_schema(),
                    session=t.session is not None,
                    idle_timeout_min=None if t.session is None else t.session.idle_timeout_min,
                ).model_dump()
                for t in app_state().templates.values()
            ]
        }
    )
