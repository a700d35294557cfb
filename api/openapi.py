"""The OpenAPI 3.1 document, generated from the pydantic models that validate requests."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import gpupool
from api.schemas import (
    IDEMPOTENCY_KEY_PATTERN,
    JOB_STATES,
    ErrorOut,
    JobList,
    JobOut,
    SubmitRequest,
    TemplateList,
    UsageOut,
)
from gpupool.templates import Template

_REF = "#/components/schemas/{model}"


def _schemas(*models: type[BaseModel]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=_REF)
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": _REF.format(model=ref)}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): {"description": "Error", "content": _json("ErrorOut")} for code in codes}


def openapi_document(templates: dict[str, Template]) -> dict[str, Any]:
    schemas = _schemas(SubmitRequest, JobOut, JobList, TemplateList, ErrorOut, UsageOut)
    # The operator's templates are the only valid names; pydantic checks the shape, the app the name.
    schemas["SubmitRequest"]["properties"]["template"]["enum"] = sorted(templates)
    for template in templates.values():
        schemas[template.params_model.__name__] = template.parameter_schema()
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
    auth_errors = (401, 429, 503)
    account_param = {"name": "account", "in": "query", "schema": {"type": "string"}, "description": "Admin tokens only: another account"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpupool", "version": gpupool.__version__},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/submit": {
                "post": {
                    "summary": "Submit a job from a template",
                    "parameters": [
                        {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN}}
                    ],
                    "requestBody": {"required": True, "content": _json("SubmitRequest")},
                    "responses": {
                        "201": {"description": "Submitted", "content": _json("JobOut")},
                        **_errors(400, 402, 403, 409, 413, 415, 422, *auth_errors),
                    },
                }
            },
            "/jobs": {
                "get": {
                    "summary": "The caller's jobs, newest first",
                    "parameters": [
                        {
                            "name": "state", "in": "query", "style": "form", "explode": False,
                            "schema": {"type": "array", "items": {"enum": list(JOB_STATES)}},
                            "description": "Only jobs in these states (comma-separated, any case)",
                        },
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}},
                        {"name": "account", "in": "query", "schema": {"type": "string"}, "description": "Admin tokens only: one account's jobs (default: all)"},
                        {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                    ],
                    "responses": {"200": {"description": "A page of jobs", "content": _json("JobList")}, **_errors(400, *auth_errors)},
                }
            },
            "/jobs/{job_id}": {
                "get": {
                    "summary": "One job",
                    "parameters": [job_id],
                    "responses": {"200": {"description": "The job", "content": _json("JobOut")}, **_errors(404, *auth_errors)},
                },
                "delete": {
                    "summary": "Cancel a job",
                    "parameters": [job_id],
                    "responses": {"202": {"description": "Cancel requested", "content": _json("JobOut")}, **_errors(404, 409, *auth_errors)},
                },
            },
            "/jobs/{job_id}/logs": {
                "get": {
                    "summary": "Tail of the job's output",
                    "parameters": [
                        job_id,
                        {"name": "stream", "in": "query", "schema": {"enum": ["stdout", "stderr"]}},
                        {"name": "tail", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 10000}},
                    ],
                    "responses": {"200": {"description": "Log lines", "content": {"text/plain": {"schema": {"type": "string"}}}}, **_errors(400, 404, *auth_errors)},
                }
            },
            "/invoices/{period}": {
                "get": {
                    "summary": "The account's invoice for a UTC month, as an RFC 4180 CSV attachment",
                    "parameters": [
                        {"name": "period", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])$"}},
                        account_param,
                    ],
                    "responses": {"200": {"description": "Invoice lines, adjustments, total", "content": {"text/csv": {"schema": {"type": "string"}}}}, **_errors(400, 404, *auth_errors)},
                }
            },
            "/usage": {
                "get": {
                    "summary": "GPU-seconds and money by GPU type and by day, and the balance",
                    "parameters": [
                        {"name": "period", "in": "query", "schema": {"type": "string", "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])$"}, "description": "Default: this month"},
                        account_param,
                    ],
                    "responses": {"200": {"description": "Usage", "content": _json("UsageOut")}, **_errors(400, 404, *auth_errors)},
                }
            },
            "/templates": {
                "get": {
                    "summary": "Templates and their parameter schemas",
                    "responses": {"200": {"description": "Templates", "content": _json("TemplateList")}, **_errors(*auth_errors)},
                }
            },
            "/healthz": {"get": {"summary": "The process is up", "security": [], "responses": {"200": {"description": "Up"}}}},
            "/readyz": {"get": {"summary": "Slurm and the database answer", "security": [], "responses": {"200": {"description": "Ready"}, **_errors(503)}}},
            "/openapi.json": {"get": {"summary": "This document", "security": [], "responses": {"200": {"description": "OpenAPI 3.1"}}}},
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics; only from the addresses in metrics_allow_cidrs (404 elsewhere)",
                    "security": [],
                    "responses": {"200": {"description": "Prometheus text format"}, **_errors(404)},
                }
            },
        },
    }
