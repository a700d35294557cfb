"""Service-level resources: health, readiness, templates and the OpenAPI document."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from sqlalchemy import text

from api.context import app_state
from api.errors import error_response
from api.openapi import openapi_document
from api.schemas import TemplateOut
from gpupool.errors import ServiceUnavailable

meta_bp = Blueprint("meta", __name__)
templates_bp = Blueprint("templates", __name__)


@meta_bp.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


@meta_bp.get("/readyz")
def readyz() -> Response:
    app = app_state()
    checks: dict[str, str] = {}
    try:
        with app.session_factory() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = "ok"
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


@meta_bp.get("/openapi.json")
def openapi() -> Response:
    return jsonify(openapi_document(app_state().templates))


@templates_bp.get("/templates")
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
