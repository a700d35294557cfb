"""Request and response schemas: they validate bodies and generate the OpenAPI document."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar, get_args

from flask import request
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic.json_schema import SkipJsonSchema

from billing.alerts import MAX_FORECAST_HOURS, MAX_THRESHOLDS, check_thresholds
from gpupool.api_keys import MAX_NAME_LENGTH as MAX_KEY_NAME_LENGTH
from gpupool.errors import BadRequest, UnknownFields, UnsupportedMediaType, ValidationFailed
from gpupool.models import TERMINAL_STATES
from gpupool.models.jobs import UNKNOWN
from gpupool.templates import validation_error_list

RequestModel = TypeVar("RequestModel", bound=BaseModel)


def json_object() -> dict[str, Any]:
    """The request's JSON object body: 415 when it is not sent as JSON, 400 when it is not an object."""
    if not request.is_json:
        raise UnsupportedMediaType("send the body as JSON with Content-Type: application/json")
    body = request.get_json(silent=True)
    if body is None:
        raise BadRequest("the body is not valid JSON")
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def request_body(model: type[RequestModel], body: Mapping[str, Any], *, refuse_unknown: bool = True) -> RequestModel:
    """A JSON body as ``model``: 400 naming fields the model does not define, else 422 naming each bad field."""
    unknown = set(body) - set(model.model_fields)
    if refuse_unknown and unknown:
        raise UnknownFields(unknown, model.model_fields)
    try:
        return model.model_validate(dict(body))
    except ValidationError as exc:
        errors = validation_error_list(exc)
        raise ValidationFailed(
            "invalid request: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors), errors=errors
        ) from exc

# Visible ASCII and spaces: what survives every HTTP stack unchanged.
IDEMPOTENCY_KEY_PATTERN = r"^[ -~]{1,255}$"
JOB_STATES = ("PENDING", "RUNNING", *sorted(TERMINAL_STATES), UNKNOWN)


def _single_line(value: str) -> str:
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("must not contain control characters (newlines, tabs, NUL)")
    return value


def _whole_number(value: object) -> object:
    """JSON's 2.0 is the integer 2 (JSON Schema's "integer"), which strict validation would refuse as a float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# In a request body's whole numbers, after their bounds (so the document still states them as
# minimum/maximum): strict (no "2", no true), but 2.0 is 2, as the document's "integer" says.
WHOLE = BeforeValidator(_whole_number)
# Far past any cluster's GPUs, and within the database's 32-bit column.
MAX_GPU_LIMIT = 1_000_000
# Far past any operator's api_key_max_days (the ceiling applied), and within a date.
MAX_KEY_DAYS = 100_000


class ArrayRequest(BaseModel):
    """``"array"`` of ``POST /submit``: Slurm's ``--array=0-(count-1)%max_parallel``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    count: Annotated[int, Field(ge=1), WHOLE] | None = Field(default=None, description="Tasks, indices 0 to count-1; with a sweep, its number of values.")
    max_parallel: Annotated[int, Field(ge=1, le=99999), WHOLE] | None = Field(default=None, description="At most this many tasks run at once.")


class SubmitRequest(BaseModel):
    """Body of ``POST /submit``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    template: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$", description="Template name, see GET /templates.")
    params: dict[str, Any] = Field(default_factory=dict, description="The template's parameters.")
    gpus: Annotated[int, Field(ge=1, le=64), WHOLE] | None = Field(default=None, description="GPUs on one node; default from the template.")
    gpu_type: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$", examples=["rtx4090"])
    cpus: Annotated[int, Field(ge=1, le=256), WHOLE] | None = Field(default=None)
    mem_gb: Annotated[int, Field(ge=1, le=4096), WHOLE] | None = Field(default=None)
    time_limit_min: Annotated[int, Field(ge=1), WHOLE] | None = Field(default=None)
    container_image: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@#+-]*$",
        description="Must match the operator's allowlist.",
        examples=["nvcr.io#nvidia/pytorch:24.01-py3"],
    )
    name: Annotated[str, AfterValidator(_single_line)] | None = Field(default=None, min_length=1, max_length=128)
    callback_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[!-~]+$",
        description="Also send this job's webhook events (job.started, job.preempted, job.ended, job.idle, job.failed) here; the answer carries its callback_secret.",
    )
    idle_timeout_min: Annotated[int, Field(ge=1, le=7 * 24 * 60), WHOLE] | None = Field(
        default=None,
        description="Session templates only: stop the session after this many idle minutes (at most the template's own).",
    )
    array: ArrayRequest | None = Field(default=None, description="Run the job as an array of tasks.")
    sweep: dict[str, list[Any]] | None = Field(
        default=None,
        description='One array task per value of one template parameter: {"param": [v1, v2, ...]}; task i gets value i.',
        examples=[{"lr": [0.1, 0.01, 0.001]}],
    )
    preemptible: bool = Field(
        default=False,
        description="Run at the spot price; any full-price job may preempt it: SIGTERM, then requeued, and it runs again "
        "later. Every run is billed at the spot price for its own seconds.",
    )
    requeue_on_failure: bool = Field(
        default=False,
        description="When a GPU under the job fails, the node's GPU check requeues the job onto a healthy node (it runs "
        "again from the start) instead of cancelling it. Either way the failed run is credited in full; the run after "
        "the requeue is billed as usual. Spot jobs are always requeued. Not for sessions or array jobs.",
    )


class GpuSampleOut(BaseModel):
    at: dt.datetime
    utilization_pct: float | None = Field(description="0-100; null when the exporter gave none.")
    memory_used_mib: float | None


class GpuSeriesOut(BaseModel):
    node: str
    index: int = Field(description="The GPU's index on its node, as Slurm's GRES IDX and the exporter name it.")
    samples: list[GpuSampleOut] = Field(description="The latest samples (about one a minute, at most 60), oldest first.")


class GpuUsageOut(BaseModel):
    idle_since: dt.datetime | None = Field(
        description="Since when every GPU of the job has been under its idle policy's threshold, once that lasted "
        "the policy's window; null while the job is busy or not judged."
    )
    idle_notified_at: dt.datetime | None = Field(description="When gpupool sent job.idle for the current idle spell.")
    idle_cancelled_at: dt.datetime | None = Field(description="When gpupool cancelled the job for idling; end_reason says why.")
    gpus: list[GpuSeriesOut] = Field(description="Recent utilization per GPU (at most 16 GPUs), from the nodes' GPU exporters.")


class JobOut(BaseModel):
    job_id: str
    name: str
    account: str
    template: str
    params: dict[str, Any]
    state: str = Field(description="Slurm's own state word: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...")
    reason: str | None = Field(description="Why the job is pending, as Slurm says it.")
    slurm_job_id: int | None
    gpus: int
    gpu_type: str | None
    cpus: int
    mem_gb: int
    time_limit_min: int
    container_image: str | None
    node: str | None
    submitted_at: dt.datetime | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    exit_code: int | None
    exit_signal: int | None
    elapsed_s: int | None
    end_reason: str | None = Field(default=None, description="Why gpupool ended the job, when it did: an idle session, idle GPUs, or \"gpu_failure: ...\" (a failed GPU; its run is credited).")
    session: bool = Field(default=False, description="A session job: see GET /jobs/<id>/session.")
    estimated_start: dt.datetime | None = Field(
        default=None,
        description="A pending job: when Slurm's scheduler (its backfill pass) expects to start it, as `squeue --start` "
        "says; null while Slurm has no estimate, and once the job is no longer pending.",
    )
    queue_position: int | None = Field(
        default=None,
        description="GET /jobs/<id> of a pending job: 1 for the first of gpupool's pending jobs of the same GPU type, "
        "in the order Slurm expects to start them (those without an estimate last, oldest first); null otherwise.",
    )
    array: TaskCounts | None = Field(default=None, description="An array job's tasks; list them at GET /jobs/<id>/tasks.")
    preemptible: bool = Field(default=False, description="A spot job: see POST /submit's preemptible.")
    requeue_on_failure: bool = Field(default=False, description="See POST /submit's requeue_on_failure.")
    run_count: int = Field(default=0, description="Runs Slurm has started: more than 1 after a preemption or a requeue.")
    gpu_usage: GpuUsageOut | None = Field(
        default=None, description="GET /jobs/<id> only: recent per-GPU utilization and the job's idle state."
    )


class QuoteDetail(BaseModel):
    gpus: int
    gpu_type: str | None = Field(description="Null: any type, priced at the highest.")
    time_limit_min: int
    gpu_seconds_worst_case: int = Field(description="gpus x time limit, in seconds: what the job can be billed for at most.")
    price_per_gpu_second: str | None = Field(
        description="Exact: the price of the asked type now, or the highest of any type; null when no price is set."
    )
    worst_case_cost: str | None = Field(
        description="gpu_seconds_worst_case x price_per_gpu_second, exact: the amount a budget check holds the job to."
    )
    currency: str


class QuoteOut(BaseModel):
    dry_run: Literal[True] = True
    would_be_admitted: Literal[True] = Field(
        default=True, description="Always true here: a request a submit would refuse gets that refusal (402, 422...) instead."
    )
    quote: QuoteDetail
    estimated_start: dt.datetime | None = Field(
        description="When Slurm would start the job if submitted now (`sbatch --test-only` as the account's tenant)."
    )


class TaskCounts(BaseModel):
    """An array job's tasks: how many there are, how many at once, and how many are in each state."""

    count: int
    max_parallel: int | None
    sweep_param: str | None
    states: dict[str, int] = Field(description="Tasks per state, e.g. {\"RUNNING\": 2, \"PENDING\": 18}.")


class TaskOut(BaseModel):
    index: int
    slurm_job_id: str = Field(description="Slurm's name for the task: <array job id>_<index>.")
    state: str
    reason: str | None
    node: str | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    exit_code: int | None
    exit_signal: int | None
    elapsed_s: int | None
    gpu_seconds: int | None = Field(description="GPUs x elapsed seconds: what the task's run is billed for.")
    value: Any = Field(default=None, description="A sweep's value for this task.")
    logs: str = Field(description="Path of the task's log: GET it with ?stream=stdout|stderr.")


class TaskList(BaseModel):
    tasks: list[TaskOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page.")


class JobList(BaseModel):
    jobs: list[JobOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page.")


class TemplateOut(BaseModel):
    name: str
    description: str
    min_gpus: int
    max_gpus: int | None
    default_gpus: int
    params_schema: dict[str, Any]
    session: bool = Field(default=False, description="Its jobs are interactive sessions (GET /jobs/<id>/session).")
    idle_timeout_min: int | None = Field(default=None, description="A session's idle timeout, in minutes.")


class TemplateList(BaseModel):
    templates: list[TemplateOut]


class SessionOut(BaseModel):
    job_id: str
    state: str = Field(description="starting, ready, idle (no request and no open WebSocket for idle_min minutes) or ended.")
    url: str = Field(description="The session's own origin; open `link`, not this, to sign in to it.")
    link: str | None = Field(description="Single-use, short-lived: opening it sets the session's cookie on its origin. Null once ended.")
    link_expires_in_s: int | None
    idle_min: int | None
    idle_timeout_min: int
    end_reason: str | None


class ErrorOut(BaseModel):
    error: str = Field(description="Stable machine-readable code.")
    message: str = Field(description="A sentence for people.")


class UsageByType(BaseModel):
    gpu_type: str
    gpu_seconds: int
    amount: str = Field(description="Exact, unrounded")


class UsageByDay(BaseModel):
    date: str = Field(description="UTC day, YYYY-MM-DD")
    gpu_seconds: int
    amount: str = Field(description="Exact, unrounded")


class BalanceOut(BaseModel):
    prepaid_credit: str | None
    monthly_limit: str | None
    spent_total: str | None
    spent_this_month: str | None
    remaining: str | None = Field(description="What the tighter budget leaves; null when the account has none")


class StorageUsageOut(BaseModel):
    quota_bytes: int = Field(description="The account's storage quota: the size of its filesystem, set by the operator")
    stored_bytes: int | None = Field(description="Bytes its files take now, as the filesystem counts them (no walk); null when its storage is not set up")
    available_bytes: int | None = Field(description="What can still be written: a write past it fails (507 storage_quota_exceeded, ENOSPC in a job)")


class StorageBilledOut(BaseModel):
    byte_seconds: int = Field(description="Bytes stored x seconds kept, as billed in the period (exact)")
    gib_hours: str = Field(description="The same in GiB-hours, to three decimals")
    amount: str = Field(description="Exact, unrounded; the invoice's storage lines round it to the cent")


class UsageOut(BaseModel):
    account: str
    period: str
    currency: str
    gpu_seconds: int
    charges: str = Field(description="Job and storage lines, each rounded to the cent as on the invoice")
    adjustments: str
    total: str = Field(description="Equals the invoice's total line")
    by_gpu_type: list[UsageByType]
    by_day: list[UsageByDay]
    balance: BalanceOut
    storage_billed: StorageBilledOut = Field(description="The account's storage billed in the period (per GiB-month)")
    storage: StorageUsageOut | None = Field(default=None, description="The account's storage (GET /files/); null where the site has none")


FileType = Literal["file", "folder", "link", "other"]


class FileEntry(BaseModel):
    name: str
    type: FileType = Field(description="A link is listed as itself and never followed: it cannot be read through the API")
    size: int | None = Field(description="Bytes, for a file; null otherwise")
    modified: str = Field(description="Last change, UTC (ISO 8601)")


class FileList(BaseModel):
    path: str = Field(description="The folder listed, relative to your storage ('' is its top)")
    entries: list[FileEntry] = Field(description="In code point order of their names")
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null on the last")
    unlisted: int = Field(description="Names on this page's range that are not UTF-8: they cannot be named through the API")


class FileOut(BaseModel):
    path: str
    type: FileType
    size: int | None
    modified: str
    etag: str | None = Field(default=None, description="A file's ETag, as GET sends it")


class SubmitOut(JobOut):
    callback_secret: str | None = Field(
        default=None, description="With callback_url: the key its deliveries are signed with (Gpupool-Signature)."
    )


# gpupool.webhooks.events.EVENT_TYPES, spelled out for pydantic and mypy; tests/unit/test_event_schemas.py holds them together.
WebhookEventType = Literal["job.started", "job.ended", "job.preempted", "job.idle", "job.failed", "budget.threshold", "budget.forecast"]


def _every_event_type() -> list[WebhookEventType]:
    return list(get_args(WebhookEventType))


class WebhookCreate(BaseModel):
    """Body of ``POST /webhooks``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(max_length=2048, pattern=r"^https?://[!-~]+$", examples=["https://example.com/gpupool-events"])
    events: list[WebhookEventType] = Field(
        default_factory=_every_event_type, min_length=1, description="Default: every event type."
    )


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[str]
    created_at: dt.datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="Shown this once: verify each delivery's Gpupool-Signature with it.")


class WebhookList(BaseModel):
    webhooks: list[WebhookOut]


class DeliveryAttemptOut(BaseModel):
    attempted_at: dt.datetime
    duration_ms: int
    status_code: int | None = Field(description="The receiver's HTTP status; null when no answer came.")
    error: str | None
    response_excerpt: str | None = Field(description="The first 1 KiB of the receiver's answer.")


class DeliveryOut(BaseModel):
    event_id: str = Field(description="Deduplicate on this: a delivery may arrive more than once.")
    event_type: str
    job_id: str | None = Field(default=None, description="None for an account-level event (budget.threshold, budget.forecast)")
    state: str = Field(description="pending, delivered, failed (retried for 24 h) or cancelled (endpoint deleted)")
    attempts: list[DeliveryAttemptOut]
    next_attempt_at: dt.datetime | None
    delivered_at: dt.datetime | None
    payload: dict[str, Any] = Field(description="The event body, as signed and sent.")


class DeliveryList(BaseModel):
    deliveries: list[DeliveryOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for older deliveries; null on the last page.")


class MemberIn(BaseModel):
    """Body of ``PUT /account/members/{subject}``: the whole of a member's settings."""

    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["admin", "member", "viewer"]
    gpu_limit: Annotated[int, Field(ge=0, le=MAX_GPU_LIMIT), WHOLE] | None = Field(default=None, description="GPUs this member may have queued or running at once")
    monthly_limit: str | None = Field(
        default=None, pattern=r"^\d{1,9}(\.\d{1,9})?$", description="This member's spend per UTC month, in the account's currency",
        examples=["250.00"],
    )
    templates: list[str] | None = Field(default=None, min_length=1, description="The only templates this member may submit")


class MemberOut(BaseModel):
    subject: str
    role: str
    gpu_limit: int | None
    monthly_limit: str | None
    templates: list[str] | None
    gpus_in_flight: int = Field(description="GPUs of this member's jobs now queued or running")
    spent_this_month: str = Field(description="What this member's jobs were billed this UTC month")
    unix_user: str | None = Field(
        default=None,
        description="The member's own Unix and Slurm user, which their jobs run as; null: the operator has not made it "
        "yet (`gpupool member migrate`), and their jobs run as the account's user",
    )
    created_at: dt.datetime
    updated_at: dt.datetime


class MemberList(BaseModel):
    members: list[MemberOut] = Field(description="Empty: the account has no members, and each of its tokens acts as its admin")
KeyScope = Literal["read", "submit", "admin"]


class KeyCreate(BaseModel):
    """Body of ``POST /keys``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[str, AfterValidator(_single_line), Field(min_length=1, max_length=MAX_KEY_NAME_LENGTH)]
    scope: KeyScope = Field(default="read", description="read: GET only; submit: also submit and cancel; admin: also manage keys.")
    expires_in_days: Annotated[int, Field(ge=1, le=MAX_KEY_DAYS), WHOLE] | None = Field(default=None, description="Default and ceiling: the operator's api_key_max_days.")
    templates: Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]], Field(min_length=1)] | None = Field(
        default=None, description="The only templates the key may submit (default: all its creator may)."
    )


class KeyOut(BaseModel):
    id: str
    name: str
    scope: KeyScope
    templates: list[str] | None
    created_at: str = Field(description="UTC, e.g. 2026-12-02T18:56:03Z", json_schema_extra={"format": "date-time"})
    expires_at: str = Field(description="UTC", json_schema_extra={"format": "date-time"})
    last_used_at: str | None = Field(
        description="UTC, to the minute; null before the key's first request.", json_schema_extra={"format": "date-time"}
    )
    revoked: bool


class KeyCreated(KeyOut):
    key: str = Field(description="The bearer secret, shown in this answer only.")


class KeyList(BaseModel):
    keys: list[KeyOut]


class AuditOut(BaseModel):
    id: int
    at: str = Field(description="UTC, ISO 8601 with Z")
    actor: str = Field(description="The token's or key's subject; operator:<user> for the operator's command line")
    via: str = Field(description="token, key (an API key), page (a signed-in web session) or cli (the operator)")
    credential: str | None = Field(description="The token's id, or key:<id> for an API key; never a secret")
    address: str | None = Field(description="The client's address as the API saw it")
    action: str = Field(description="key.create, key.revoke, member.set, member.remove, alerts.set, webhook.create, "
                        "webhook.delete, job.cancel, task.cancel, signin, signout, or an operator's account.*, token.*, "
                        "price.set, adjustment.add, idle_policy.*, member.user, node.drain, node.resume, run.credit")
    target: str | None
    details: dict[str, Any] | None = Field(description="What was asked for: scope, role, limits, thresholds; never a secret")


class AuditList(BaseModel):
    events: list[AuditOut] = Field(description="Newest first")
    next_before: int | None = Field(description="Pass as ?before= for older events; null on the last page")


def _thresholds(values: list[int]) -> list[int]:
    return list(check_thresholds(values))


class AlertsIn(BaseModel):
    """Body of ``PUT /account/alerts``: a field left out keeps its value."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Left out keeps the thresholds; null means nothing, so the document does not offer it (SkipJsonSchema).
    thresholds: Annotated[
        list[Annotated[int, Field(ge=1, le=100), WHOLE]], Field(min_length=1, max_length=MAX_THRESHOLDS), AfterValidator(_thresholds)
    ] | SkipJsonSchema[None] = Field(
        default=None,
        description="Percentages of the prepaid credit / monthly limit used, e.g. [50, 80, 100]; each fires once per period.",
        examples=[[50, 80, 100]],
    )
    forecast_hours: Annotated[int, Field(ge=1, le=MAX_FORECAST_HOURS), WHOLE] | None = Field(
        default=None,
        description="Alert (budget.forecast) when, at the last 24 hours' spend rate, what is left lasts fewer than this "
        "many hours; null turns the forecast off.",
        examples=[48],
    )

    @field_validator("thresholds", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:
            raise ValueError("give a list of whole percentages, e.g. [50, 80, 100], or leave thresholds out")
        return value


class AlertBudget(BaseModel):
    kind: Literal["credit", "limit"]
    period: str = Field(description="The month (limit), or credit:<total> (credit): a top-up re-arms every alert.")
    used: str
    total: str
    currency: str
    fired: list[int] = Field(description="Thresholds fired this period.")
    rate_per_hour: str = Field(description="The last 24 hours' spend, per hour.")
    hours_left: str | None = Field(description="What is left at that rate, in hours; null when nothing was spent.")
    forecast_fired: bool = Field(description="The forecast alert has fired this period.")


class AlertsOut(BaseModel):
    account: str
    thresholds: list[int]
    forecast_hours: int | None = Field(description="Null: no forecast alert.")
    budgets: list[AlertBudget]
