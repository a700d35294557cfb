"""The OpenAPI 3.1 document, generated from the pydantic models that validate requests."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

import gpupool
from api.audit import MAX_EVENT_ID
from api.event_schemas import EVENTS, event_models
from api.files import DEFAULT_PAGE as FILES_DEFAULT_PAGE
from api.files import MAX_PAGE as FILES_MAX_PAGE
from api.files import UPLOAD_OFFSET
from api.jobs import MAX_LOG_LINES, MAX_LOG_OFFSET, MAX_PAGE, MAX_TASK_CURSOR
from api.schemas import (
    IDEMPOTENCY_KEY_PATTERN,
    JOB_STATES,
    AlertsIn,
    AlertsOut,
    AuditList,
    DeliveryList,
    ErrorOut,
    FileList,
    FileOut,
    JobList,
    JobOut,
    KeyCreate,
    KeyCreated,
    KeyList,
    MemberIn,
    MemberList,
    MemberOut,
    QuoteOut,
    SessionOut,
    SubmitOut,
    SubmitRequest,
    TaskList,
    TaskOut,
    TemplateList,
    UsageOut,
    WebhookCreate,
    WebhookCreated,
    WebhookList,
)
from api.webhooks import MAX_CURSOR_DIGITS, MAX_DELIVERY_PAGE
from billing.calendar import PERIOD
from billing.report.schema import ReportOut
from gpupool.audit import MAX_PAGE as AUDIT_MAX_PAGE
from gpupool.config import Settings
from gpupool.templates import Template

_REF = "#/components/schemas/{model}"
_DEFAULT_LOG_READ_KIB = Settings.log_read_max_bytes // 1024



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


_LOGS_DESCRIPTION = (
    "Without offset: the last `tail` lines, at most log_read_max_bytes. With `offset`: the bytes from it, "
    "at most `limit`, answered at once with what is there (empty at or past the end). Follow a job by "
    "reading again from Gpupool-Next-Offset until Gpupool-Log-Complete is true. 409 log_unavailable: the "
    "job put a symbolic link, FIFO or another user's file where its log belongs, and it is not followed."
)
_LOG_LIMIT = {
    "name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LOG_OFFSET},
    "description": f"With offset: at most this many bytes; a larger limit reads the server's log_read_max_bytes "
    f"({_DEFAULT_LOG_READ_KIB} KiB unless configured), which is also the default",
}
_LOG_HEADERS = {
    "Gpupool-Job-State": {"description": "The job's state, as GET /jobs/{job_id} shows it (PENDING, RUNNING, COMPLETED, ...)", "schema": {"type": "string"}},
    "Gpupool-Next-Offset": {"description": "Offset reads only: the offset to read from next", "schema": {"type": "integer", "minimum": 0}},
    "Gpupool-Log-Complete": {
        "description": "Offset reads only: true when the job has ended and the next offset is the log's size, so nothing more will come",
        "schema": {"enum": ["true", "false"]},
    },
}


_SIGNATURE_DESCRIPTION = (
    "t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<raw body>\" keyed by the endpoint's secret>. "
    "Reject deliveries whose t is more than 5 minutes off; gpupool_client.verify_signature does both checks."
)


def _webhook_paths(auth_errors: tuple[int, ...]) -> dict[str, Any]:
    endpoint_id = {"name": "endpoint_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
    return {
        "/webhooks": {
            "post": {
                "summary": "Register a webhook endpoint; its signing secret is in this answer only",
                "description": "The URL's host is resolved now: loopback, private, link-local and metadata addresses are refused (422 webhook_url_refused) unless the operator allowlists them; nothing is sent.",
                "requestBody": {"required": True, "content": _json("WebhookCreate")},
                "responses": {"201": {"description": "Registered", "content": _json("WebhookCreated")}, **_errors(400, 409, 415, 422, *auth_errors)},
            },
            "get": {
                "summary": "The account's webhook endpoints (without secrets)",
                "responses": {"200": {"description": "Endpoints", "content": _json("WebhookList")}, **_errors(*auth_errors)},
            },
        },
        "/webhooks/{endpoint_id}": {
            "delete": {
                "summary": "Stop sending to an endpoint; deliveries not yet made are cancelled",
                "parameters": [endpoint_id],
                "responses": {"204": {"description": "Deleted"}, **_errors(404, *auth_errors)},
            }
        },
        "/webhooks/{endpoint_id}/deliveries": {
            "get": {
                "summary": "Events owed to an endpoint, newest first, with every attempt and the receiver's answers",
                "parameters": [
                    endpoint_id,
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_DELIVERY_PAGE}},
                    {"name": "cursor", "in": "query", "schema": {"type": "string", "pattern": f"^[0-9]{{1,{MAX_CURSOR_DIGITS}}}$"}},
                ],
                "responses": {"200": {"description": "Deliveries", "content": _json("DeliveryList")}, **_errors(400, 404, *auth_errors)},
            }
        },
    }


def _key_paths(auth_errors: tuple[int, ...]) -> dict[str, Any]:
    """``/keys``: API keys a customer creates for its own account (api.keys)."""
    return {
        "/keys": {
            "post": {
                "summary": "Create an API key; its secret is in this answer only",
                "requestBody": {"required": True, "content": _json("KeyCreate")},
                "responses": {"201": {"description": "Created", "content": _json("KeyCreated")}, **_errors(400, 403, 415, 422, *auth_errors)},
            },
            "get": {
                "summary": "The account's API keys (without secrets)",
                "responses": {"200": {"description": "Keys", "content": _json("KeyList")}, **_errors(403, *auth_errors)},
            },
        },
        "/keys/{key_id}": {
            "delete": {
                "summary": "Revoke a key at once",
                "parameters": [{"name": "key_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"204": {"description": "Revoked"}, **_errors(403, 404, *auth_errors)},
            }
        },
    }


def _audit_paths(auth_errors: tuple[int, ...], account_param: dict[str, Any]) -> dict[str, Any]:
    """``/account/audit``: who changed the account's keys, members, alerts and webhooks (api.audit)."""
    number = {"type": "integer", "minimum": 1}
    return {
        "/account/audit": {
            "get": {
                "summary": "The account's audit log, newest first (account admins)",
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {**number, "maximum": AUDIT_MAX_PAGE, "default": 100}},
                    {"name": "before", "in": "query", "schema": {**number, "maximum": MAX_EVENT_ID}, "description": "next_before of the previous page"},
                    account_param,
                ],
                "responses": {"200": {"description": "Events", "content": _json("AuditList")}, **_errors(400, 403, 404, *auth_errors)},
            }
        },
    }


def _member_paths(auth_errors: tuple[int, ...], account_param: dict[str, Any]) -> dict[str, Any]:
    """``/account/members``: the account's people, for its admins (api.members, gpupool.members)."""
    subject = {"name": "subject", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 255}}
    return {
        "/account/members": {
            "get": {
                "summary": "The account's members, their roles, limits and this month's spend (admins)",
                "parameters": [account_param],
                "responses": {"200": {"description": "Members", "content": _json("MemberList")}, **_errors(403, 404, *auth_errors)},
            }
        },
        "/account/members/{subject}": {
            "put": {
                "summary": "Add a member or set every setting of one; the first member added enrolls the calling admin",
                "parameters": [subject, account_param],
                "requestBody": {"required": True, "content": _json("MemberIn")},
                "responses": {"200": {"description": "The member", "content": _json("MemberOut")}, **_errors(400, 403, 404, 409, 415, 422, *auth_errors)},
            },
            "delete": {
                "summary": "Take a subject out of the account; its tokens and keys are refused from then on",
                "parameters": [subject, account_param],
                "responses": {"204": {"description": "Removed"}, **_errors(403, 404, 409, *auth_errors)},
            },
        },
    }


_FILE_PATH = {
    "name": "path", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 4096},
    "description": "Relative to your storage, names joined by /; a trailing / names a folder. No '..', '.', empty "
    "names, NUL or control characters, no leading / (400 path_invalid); a name is at most 255 bytes of UTF-8",
}
_LISTING_PARAMS = [
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": FILES_MAX_PAGE, "default": FILES_DEFAULT_PAGE}},
    {"name": "cursor", "in": "query", "schema": {"type": "string"}, "description": "next_cursor of the page before"},
]
_DOWNLOAD_HEADERS = {
    "ETag": {"schema": {"type": "string"}},
    "Last-Modified": {"schema": {"type": "string"}},
    "Accept-Ranges": {"schema": {"const": "bytes"}},
    UPLOAD_OFFSET: {"description": "HEAD only: bytes an interrupted upload of this path holds (0: none), also on a 404", "schema": {"type": "integer"}},
}
_BYTES = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def _file_paths(auth_errors: tuple[int, ...]) -> dict[str, Any]:
    """``/files``: the account's storage (api.files, gpupool.storage)."""
    listing = {"description": "A page of the folder's entries", "content": _json("FileList")}
    return {
        "/files/": {
            "get": {
                "summary": "The top of your storage: a page of its entries",
                "parameters": _LISTING_PARAMS,
                "responses": {"200": listing, **_errors(400, 404, *auth_errors)},
            }
        },
        "/files/{path}": {
            "get": {
                "summary": "Download a file (Range: one range, 206; If-None-Match, If-Modified-Since: 304), or list a folder",
                "description": "Served as it is stored, as an attachment (application/octet-stream). A symbolic link is never "
                "followed: 404, as for a missing name. HEAD answers the same headers and Upload-Offset.",
                "parameters": [_FILE_PATH, *_LISTING_PARAMS, {"name": "Range", "in": "header", "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "The file, or a folder's listing", "headers": _DOWNLOAD_HEADERS, "content": {**_BYTES, **_json("FileList")}},
                    "206": {"description": "The range asked for (Content-Range)", "headers": _DOWNLOAD_HEADERS, "content": _BYTES},
                    "304": {"description": "Not modified"},
                    "416": {"description": "No byte of the range is in the file (Content-Range: bytes */size)", "content": _json("ErrorOut")},
                    **_errors(400, 404, 409, *auth_errors),
                },
            },
            "put": {
                "summary": "Upload a file (streamed; whole or not at all under its name), or make a folder (path ending in /)",
                "description": f"Content-Length is required (411). The body goes to the path's upload in progress and is renamed "
                f"into place once complete: a reader sees the old file or the whole new one. A body cut off keeps what arrived: "
                f"HEAD tells how much ({UPLOAD_OFFSET}); PUT the rest with {UPLOAD_OFFSET}: N to complete it (409 "
                f"upload_offset_mismatch, with `offset`, when N is not what is kept). One upload of a path at a time (409 "
                f"upload_in_progress). Past the quota: 507 storage_quota_exceeded, and the upload's bytes are removed.",
                "parameters": [
                    _FILE_PATH,
                    {"name": UPLOAD_OFFSET, "in": "header", "schema": {"type": "integer", "minimum": 0},
                     "description": "Continue an interrupted upload: the bytes it holds (HEAD); the body is the rest"},
                ],
                "requestBody": {"content": _BYTES},
                "responses": {
                    "200": {"description": "Replaced", "content": _json("FileOut")},
                    "201": {"description": "Created", "content": _json("FileOut")},
                    **_errors(400, 403, 404, 409, 411, 507, *auth_errors),
                },
            },
            "delete": {
                "summary": "Delete a file, a link or an empty folder (recursive=true: any folder), and the path's upload in progress",
                "parameters": [_FILE_PATH, {"name": "recursive", "in": "query", "schema": {"enum": ["true", "false"]}}],
                "responses": {"204": {"description": "Deleted"}, **_errors(400, 403, 404, 409, *auth_errors)},
            },
            "post": {
                "summary": "Move (rename) a file or folder within your storage",
                "parameters": [
                    _FILE_PATH,
                    {"name": "move_to", "in": "query", "required": True, "schema": {"type": "string"}, "description": "The new path"},
                    {"name": "overwrite", "in": "query", "schema": {"enum": ["true", "false"]}, "description": "Replace a file at move_to (409 already_exists otherwise)"},
                ],
                "responses": {"200": {"description": "Moved", "content": _json("FileOut")}, **_errors(400, 403, 404, 409, *auth_errors)},
            },
        },
    }


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
                "requestBody": {"required": True, "content": _json(model.__name__)},
                "responses": answer,
            }
        }
    return documented


def _only_templates(prop: dict[str, Any], names: list[str]) -> None:
    """A list of template names (maybe nullable): each item one of the operator's templates."""
    for option in prop.get("anyOf", [prop]):
        if option.get("type") == "array":
            option["items"] = {**option.get("items", {}), "enum": names}


def openapi_document(templates: dict[str, Template]) -> dict[str, Any]:
    schemas = _schemas(
        SubmitRequest, JobOut, SubmitOut, JobList, TemplateList, ErrorOut, UsageOut,
        WebhookCreate, WebhookCreated, WebhookList, DeliveryList, SessionOut, QuoteOut, TaskList, TaskOut, ReportOut,
        MemberIn, MemberOut, MemberList,
        KeyCreate, KeyCreated, KeyList, AlertsIn, AlertsOut, AuditList, FileList, FileOut, *event_models(),
    )
    # The operator's templates are the only valid names; pydantic checks the shape, the app the name.
    schemas["SubmitRequest"]["properties"]["template"]["enum"] = sorted(templates)
    for model in ("KeyCreate", "MemberIn"):
        _only_templates(schemas[model]["properties"]["templates"], sorted(templates))
    for template in templates.values():
        schemas[template.params_model.__name__] = template.parameter_schema()
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
    # Every operation with a token: 400 for a query parameter given twice (api.query), 403 when
    # the caller's role in the account, or its key's scope, does not allow it (gpupool.members'
    # roles, api_keys' scopes).
    auth_errors = (400, 401, 403, 429, 503)
    task_index = {"name": "index", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}}
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
                    "description": "409 job_limit_reached: the account already has as many jobs pending or running as Slurm lets it "
                    "hold (each array task counts as one); `limit`, `in_use` and `asked` say how many.",
                    "parameters": [
                        {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN}},
                        {
                            "name": "dry_run", "in": "query", "required": False, "schema": {"enum": ["true", "false"]},
                            "description": "true: the same checks and refusals, but nothing is created; answers 200 with the quote (as POST /quote)",
                        },
                    ],
                    "requestBody": {"required": True, "content": _json("SubmitRequest")},
                    "responses": {
                        "200": {"description": "dry_run=true: what the job would cost at most, and when Slurm would start it", "content": _json("QuoteOut")},
                        "201": {
                            "description": "Submitted (or, with a used Idempotency-Key and the same body, the job it made)",
                            "headers": {"Idempotent-Replayed": {"description": "true when this answer replays an earlier submit", "schema": {"enum": ["true"]}}},
                            "content": _json("SubmitOut"),
                        },
                        **_errors(400, 402, 403, 409, 413, 415, 422, *auth_errors),
                    },
                }
            },
            "/quote": {
                "post": {
                    "summary": "A dry run of POST /submit: its checks, the worst-case cost and Slurm's start estimate; creates nothing",
                    "description": "Refused as the submit would be (402 when the budget does not cover the worst case, 422...). "
                    "The estimate is `sbatch --test-only` run as the account's tenant; null when Slurm gives none.",
                    "requestBody": {"required": True, "content": _json("SubmitRequest")},
                    "responses": {"200": {"description": "The quote", "content": _json("QuoteOut")}, **_errors(400, 402, 403, 413, 415, 422, *auth_errors)},
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
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}},
                        {"name": "account", "in": "query", "schema": {"type": "string"}, "description": "Admin tokens only: one account's jobs (default: all)"},
                        {
                            "name": "cursor", "in": "query", "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]+={0,2}$"},
                            "description": "next_cursor of the page before, as the API gave it (400 for any other)",
                        },
                    ],
                    "responses": {"200": {"description": "A page of jobs", "content": _json("JobList")}, **_errors(400, 404, *auth_errors)},
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
                    "summary": "Tail of the job's output, or its bytes from an offset for a follower",
                    "description": _LOGS_DESCRIPTION,
                    "parameters": [
                        job_id,
                        {"name": "stream", "in": "query", "schema": {"enum": ["stdout", "stderr"]}},
                        {"name": "tail", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LOG_LINES}, "description": "The last N lines (default 100); not with offset"},
                        {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LOG_OFFSET}, "description": "Return the bytes from this offset (start at 0, then send Gpupool-Next-Offset back); not with tail"},
                        _LOG_LIMIT,
                    ],
                    "responses": {
                        "200": {
                            "description": "Log bytes (UTF-8 text, but an offset read may end inside a character)",
                            "headers": _LOG_HEADERS,
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        **_errors(400, 404, 409, *auth_errors),
                    },
                }
            },
            "/jobs/{job_id}/tasks": {
                "get": {
                    "summary": "An array job's tasks in index order, each with its state, exit code, GPU-seconds and sweep value",
                    "parameters": [
                        job_id,
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}},
                        {"name": "cursor", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": MAX_TASK_CURSOR}, "description": "next_cursor of the page before"},
                    ],
                    "responses": {"200": {"description": "A page of tasks", "content": _json("TaskList")}, **_errors(400, 404, *auth_errors)},
                }
            },
            "/jobs/{job_id}/tasks/{index}": {
                "get": {
                    "summary": "One task of an array job",
                    "parameters": [job_id, task_index],
                    "responses": {"200": {"description": "The task", "content": _json("TaskOut")}, **_errors(404, *auth_errors)},
                },
                "delete": {
                    "summary": "Cancel one task of an array job; its other tasks go on (DELETE /jobs/{job_id} cancels them all)",
                    "parameters": [job_id, task_index],
                    "responses": {"202": {"description": "Cancel requested", "content": _json("TaskOut")}, **_errors(404, 409, *auth_errors)},
                },
            },
            "/jobs/{job_id}/tasks/{index}/logs": {
                "get": {
                    "summary": "One array task's log, read as GET /jobs/{job_id}/logs reads a job's",
                    "description": _LOGS_DESCRIPTION,
                    "parameters": [
                        job_id,
                        task_index,
                        {"name": "stream", "in": "query", "schema": {"enum": ["stdout", "stderr"]}},
                        {"name": "tail", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LOG_LINES}},
                        {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LOG_OFFSET}},
                        _LOG_LIMIT,
                    ],
                    "responses": {
                        "200": {"description": "Log bytes", "headers": _LOG_HEADERS, "content": {"text/plain": {"schema": {"type": "string"}}}},
                        **_errors(400, 404, 409, *auth_errors),
                    },
                }
            },
            "/jobs/{job_id}/session": {
                "get": {
                    "summary": "A session job's state and a single-use link that opens it in a browser",
                    "parameters": [job_id],
                    "responses": {"200": {"description": "The session", "content": _json("SessionOut")}, **_errors(404, *auth_errors)},
                }
            },
            "/invoices/{period}": {
                "get": {
                    "summary": "The account's invoice for a UTC month, as an RFC 4180 CSV attachment",
                    "parameters": [
                        {"name": "period", "in": "path", "required": True, "schema": {"type": "string", "pattern": PERIOD.pattern}},
                        account_param,
                    ],
                    "responses": {"200": {"description": "Invoice lines, adjustments, total", "content": {"text/csv": {"schema": {"type": "string"}}}}, **_errors(400, 404, *auth_errors)},
                }
            },
            "/usage": {
                "get": {
                    "summary": "GPU-seconds and money by GPU type and by day, the balance, and the storage stored and its quota",
                    "parameters": [
                        {"name": "period", "in": "query", "schema": {"type": "string", "pattern": PERIOD.pattern}, "description": "Default: this month"},
                        account_param,
                    ],
                    "responses": {"200": {"description": "Usage", "content": _json("UsageOut")}, **_errors(400, 404, *auth_errors)},
                }
            },
            "/account/alerts": {
                "get": {
                    "summary": "Spend-alert thresholds, each budget's figures and the thresholds fired this period",
                    "parameters": [account_param],
                    "responses": {"200": {"description": "Alerts", "content": _json("AlertsOut")}, **_errors(404, *auth_errors)},
                },
                "put": {
                    "summary": "Set the account's spend-alert thresholds (percentages 1-100 of its credit / monthly limit, at most 10) and run-out forecast",
                    "parameters": [account_param],
                    "requestBody": {"required": True, "content": _json("AlertsIn")},
                    "responses": {"200": {"description": "Alerts", "content": _json("AlertsOut")}, **_errors(400, 404, 415, 422, *auth_errors)},
                },
            },
            "/templates": {
                "get": {
                    "summary": "Templates and their parameter schemas",
                    "responses": {"200": {"description": "Templates", "content": _json("TemplateList")}, **_errors(*auth_errors)},
                }
            },
            **_webhook_paths(auth_errors),
            **_key_paths(auth_errors),
            **_member_paths(auth_errors, account_param),
            **_audit_paths(auth_errors, account_param),
            **_file_paths(auth_errors),
            "/admin/report": {
                "get": {
                    "summary": "Admin tokens only (404 to anyone else): revenue, utilization, queue wait and payback",
                    "parameters": [
                        {"name": "period", "in": "query", "schema": {"type": "string", "pattern": PERIOD.pattern}, "description": "A UTC month (default: this month)"},
                        {"name": "since", "in": "query", "schema": {"type": "string", "format": "date-time"}, "description": "Range start, instead of period (no zone: UTC)"},
                        {"name": "until", "in": "query", "schema": {"type": "string", "format": "date-time"}, "description": "Range end (default: now); at most 400 days after since"},
                    ],
                    "responses": {
                        "200": {"description": "The report", "content": _json("ReportOut")},
                        **_errors(400, 404, *auth_errors),
                    },
                }
            },
            "/healthz": {"get": {"summary": "The process is up", "security": [], "responses": {"200": {"description": "Up"}}}},
            "/readyz": {"get": {"summary": "Slurm and the database answer", "security": [], "responses": {"200": {"description": "Ready"}, **_errors(503)}}},
            "/openapi.json": {"get": {"summary": "This document", "security": [], "responses": {"200": {"description": "OpenAPI 3.1"}}}},
            "/docs": {"get": {"summary": "This document, rendered by Swagger UI", "security": [], "responses": {"200": {"description": "An HTML page"}}}},
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics; only from the addresses in metrics_allow_cidrs (404 elsewhere)",
                    "security": [],
                    "responses": {"200": {"description": "Prometheus text format"}, **_errors(404)},
                }
            },
        },
        "webhooks": _webhook_events(),
    }
