"""What gpupool POSTs to webhook receivers: one model per event body, for the OpenAPI ``webhooks`` section.

The payloads are built where the events happen (``gpupool.webhooks`` for a job's,
``gpupool.gpu_usage.idle`` for ``job.idle``, ``billing.alerts`` for the budget's);
these models describe them and forbid anything they do not name, so
tests/unit/test_event_schemas.py fails when a payload gains a field the
document does not show.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpupool.webhooks.events import (
    BUDGET_FORECAST,
    BUDGET_THRESHOLD,
    JOB_ENDED,
    JOB_FAILED,
    JOB_IDLE,
    JOB_PREEMPTED,
    JOB_STARTED,
    NODE_DRAINED,
)
from gpupool.webhooks.outbox import OUTPUT_FILES_CAP


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EventJob(_Payload):
    """The job an event is about, as it stood when the event was made."""

    job_id: str
    account: str
    name: str
    template: str
    state: str = Field(description="Slurm's word: RUNNING, COMPLETED, FAILED, CANCELLED, PREEMPTED, ...")
    slurm_job_id: int | None
    gpus: int
    gpu_type: str | None
    node: str | None
    submitted_at: str | None = Field(description="UTC, ISO 8601 with Z")
    started_at: str | None
    ended_at: str | None
    exit_code: int | None
    exit_signal: int | None
    elapsed_s: int | None
    end_reason: str | None = Field(
        description='Why gpupool ended the job (an idle session, idle GPUs, "gpu_failure: ..." a failed GPU); null otherwise'
    )
    preemptible: bool
    run_count: int
    gpu_seconds: int | None = Field(description="job.ended only, once a billing pass has billed the job; else null")
    output_files: int | None = Field(
        description="job.ended only: how many files the job left at the top of its output folder ($GPUPOOL_OUTPUT_DIR; "
        f"folders are not looked into, links are not files), counted once when the event was made, at most {OUTPUT_FILES_CAP} "
        f"(among the folder's first {OUTPUT_FILES_CAP} names); 0 when the job made no output folder. null for other events, "
        "or when it could not be counted. GET /jobs/<id>/outputs/ lists them.",
        ge=0, le=OUTPUT_FILES_CAP,
    )


class IdleGpu(_Payload):
    node: str
    index: int = Field(description="The GPU's index on its node, as Slurm's GRES IDX names it")


class IdlePolicyOut(_Payload):
    window_min: int
    threshold_pct: int
    grace_min: int
    cancel: bool
    source: str = Field(description='"account <name>", "template <name>" or "default"')


class IdleNotice(_Payload):
    since: str | None = Field(description="Since when every GPU of the job has been under the threshold")
    policy: IdlePolicyOut
    cancel_after: str | None = Field(description="When gpupool cancels the job unless its GPUs get busy; null: it will not")
    gpus: list[IdleGpu]


class BudgetAlert(_Payload):
    account: str
    kind: Literal["credit", "limit"] = Field(description="The prepaid credit, or the monthly limit")
    threshold: int | None = Field(default=None, description="budget.threshold: the percentage crossed")
    used: str = Field(description="Spent against the budget, exact decimal text")
    total: str
    currency: str
    period: str = Field(description='The budget\'s period: "YYYY-MM" for a limit, "credit:<total>" for a credit')
    forecast_hours: int | None = Field(default=None, description="budget.forecast: the account's horizon in hours")
    remaining: str | None = Field(default=None, description="budget.forecast: what is left")
    rate_per_hour: str | None = Field(default=None, description="budget.forecast: the last 24 hours' spend per hour")
    hours_left: str | None = Field(default=None, description="budget.forecast: what is left at that rate, in hours")


class JobEventData(_Payload):
    job: EventJob


class JobIdleData(_Payload):
    job: EventJob
    idle: IdleNotice


class GpuFailureNotice(_Payload):
    node: str
    gpu: str = Field(description="The failed GPU's PCI bus id, or the device file gres.conf names")
    xid: int | None = Field(description="The NVIDIA Xid the kernel logged, when the failure was one")
    reason: str = Field(description="What the node's GPU check found, e.g. \"Xid 79 on 0000:41:00.0\"")
    at: str = Field(description="When the check found it, UTC")
    requeued: bool = Field(
        description="The job was requeued (it asked for requeue_on_failure, or is a spot job) and runs again on a healthy node"
    )


class JobFailedData(_Payload):
    job: EventJob
    gpu_failure: GpuFailureNotice
    run_started_at: str = Field(description="The start of the run the failure ended")
    credited: str = Field(description="What the run had been charged, credited back on the invoice (exact decimal text)")


class DrainedNode(_Payload):
    name: str
    reason: str = Field(description="Slurm's drain reason, as the GPU check set it, e.g. \"gpu: Xid 79 on 0000:41:00.0\"")
    drained_at: str = Field(description="When Slurm set the reason, UTC")
    resume_with: str = Field(description="The command that returns the node to service, once the GPU is sound or replaced")


class NodeDrainedData(_Payload):
    node: DrainedNode


class BudgetEventData(_Payload):
    alert: BudgetAlert


class _Event(_Payload):
    id: str = Field(description="Also in Gpupool-Event-Id: deduplicate on it (delivery is at least once)")
    created_at: dt.datetime


class JobEvent(_Event):
    type: Literal["job.started", "job.ended", "job.preempted"]
    data: JobEventData


class JobIdleEvent(_Event):
    type: Literal["job.idle"]
    data: JobIdleData


class JobFailedEvent(_Event):
    type: Literal["job.failed"]
    data: JobFailedData


class NodeDrainedEvent(_Event):
    type: Literal["node.drained"]
    data: NodeDrainedData


class BudgetEvent(_Event):
    type: Literal["budget.threshold", "budget.forecast"]
    data: BudgetEventData


# event type -> (its body's model, the OpenAPI summary)
EVENTS: dict[str, tuple[type[_Event], str]] = {
    JOB_STARTED: (JobEvent, "A job started running (a requeued spot job: each run)"),
    JOB_PREEMPTED: (JobEvent, "A spot job was preempted by a full-price job: requeued, it runs again later"),
    JOB_ENDED: (JobEvent, "A job ended, with its final state and exit code"),
    JOB_FAILED: (JobFailedEvent, "A failed GPU ended a run of the job, and the run was credited in full (once per run)"),
    JOB_IDLE: (JobIdleEvent, "Every GPU of a running job stayed under its idle policy's threshold for the policy's window"),
    BUDGET_THRESHOLD: (BudgetEvent, "A billing pass found the account's spend past one of its alert thresholds (once per period)"),
    BUDGET_FORECAST: (BudgetEvent, "At the last 24 hours' rate the account's budget runs out within its forecast horizon"),
    NODE_DRAINED: (
        NodeDrainedEvent,
        "The operator's webhook only (operator_webhook_url), never an account's: the GPU check drained a node (once per drain)",
    ),
}


def event_models() -> list[type[BaseModel]]:
    """Every model the ``webhooks`` section refers to, for the document's components."""
    return [JobEvent, JobIdleEvent, JobFailedEvent, BudgetEvent, NodeDrainedEvent]


def validate_event(body: dict[str, Any]) -> BaseModel:
    """The body as its type's model: ValidationError when it does not match what the document says."""
    model, _ = EVENTS[body["type"]]
    return model.model_validate(body)
