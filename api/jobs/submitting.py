"""Submitting a job and quoting one: POST /submit and POST /quote (the ``submit`` blueprint, rate-limited apart)."""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, Response, jsonify, request, url_for

from api.context import app_state, db_session, principal
from api.jobs.views import job_view
from api.metrics import JOBS_SUBMITTED
from api.routing import Reply, operation
from api.schemas import (
    IDEMPOTENCY_KEY_PATTERN,
    QuoteDetail,
    QuoteOut,
    SubmitOut,
    SubmitRequest,
    json_object,
    request_body,
)
from api.submission import Quote, quote, submit
from billing.money import format_nanos
from gpupool.errors import BadRequest
from gpupool.members import WRITERS
from gpupool.webhooks.endpoints import job_callback_secret

submit_bp = Blueprint("submit", __name__)


def _idempotency_key() -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key):
        raise BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters or spaces")
    return key


def submit_request(body: dict[str, Any]) -> SubmitRequest:
    """``body`` as a typed submit request, or ValidationFailed naming each field: the API's and the form's rule."""
    return request_body(SubmitRequest, body, refuse_unknown=False)


def _dry_run_arg() -> bool:
    raw = request.args.get("dry_run")
    if raw is None or raw.lower() == "false":
        return False
    if raw.lower() == "true":
        return True
    raise BadRequest("dry_run must be true or false")


def quote_view(found: Quote) -> dict[str, Any]:
    cost = found.cost
    return QuoteOut(
        quote=QuoteDetail(
            gpus=found.gpus,
            gpu_type=found.gpu_type,
            time_limit_min=found.time_limit_min,
            gpu_seconds_worst_case=cost.gpu_seconds,
            price_per_gpu_second=None if cost.unit_price_nanos is None else format_nanos(cost.unit_price_nanos),
            worst_case_cost=None if cost.amount_nanos is None else format_nanos(cost.amount_nanos),
            currency=found.currency,
        ),
        estimated_start=found.estimated_start,
    ).model_dump(mode="json")


def _submit_body() -> tuple[dict[str, Any], SubmitRequest]:
    body = json_object()
    return body, request_body(SubmitRequest, body)


@operation(
    submit_bp, "POST", "/quote", roles=WRITERS,
    summary="A dry run of POST /submit: its checks, the worst-case cost and Slurm's start estimate; creates nothing",
    description="Refused as the submit would be (402 when the budget does not cover the worst case, 422...). "
    "The estimate is `sbatch --test-only` run as the account's tenant; null when Slurm gives none.",
    request=SubmitRequest, replies={"200": Reply("The quote", QuoteOut)}, errors=(400, 402, 403, 413, 415, 422),
)
def quote_job() -> tuple[Response, int]:
    """``POST /submit?dry_run=true`` under its own name."""
    _body, req = _submit_body()
    return jsonify(quote_view(quote(app_state(), db_session(), principal(), req))), 200


@operation(
    submit_bp, "POST", "/submit", roles=WRITERS,
    summary="Submit a job from a template",
    description="409 job_limit_reached: the account already has as many jobs pending or running as Slurm lets it "
    "hold (each array task counts as one); `limit`, `in_use` and `asked` say how many.",
    parameters=[
        {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN}},
        {
            "name": "dry_run", "in": "query", "required": False, "schema": {"enum": ["true", "false"]},
            "description": "true: the same checks and refusals, but nothing is created; answers 200 with the quote (as POST /quote)",
        },
    ],
    request=SubmitRequest,
    replies={
        "200": Reply("dry_run=true: what the job would cost at most, and when Slurm would start it", QuoteOut),
        "201": Reply(
            "Submitted (or, with a used Idempotency-Key and the same body, the job it made)", SubmitOut,
            headers={"Idempotent-Replayed": {"description": "true when this answer replays an earlier submit", "schema": {"enum": ["true"]}}},
        ),
    },
    errors=(400, 402, 403, 409, 413, 415, 422),
)
def submit_job() -> tuple[Response, int] | tuple[Response, int, dict[str, str]]:
    if _dry_run_arg():
        return quote_job()
    body, req = _submit_body()
    job, replayed, callback_secret = submit(app_state(), db_session(), principal(), req, body, _idempotency_key())
    headers = {"Location": url_for("jobs.get_job", job_id=job.id)}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    else:
        JOBS_SUBMITTED.labels(template=job.template).inc()
    view = job_view(job)
    if req.callback_url is not None:
        # A new job's from its insert; a replay's read back.
        view["callback_secret"] = callback_secret if callback_secret is not None else job_callback_secret(db_session(), job.id)
    return jsonify(view), 201, headers


