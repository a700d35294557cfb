"""Request and response schemas: they validate bodies and generate the OpenAPI document."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gpupool.models import TERMINAL_STATES

# Visible ASCII and spaces: what survives every HTTP stack unchanged.
IDEMPOTENCY_KEY_PATTERN = r"^[ -~]{1,255}$"
JOB_STATES = ("PENDING", "RUNNING", *sorted(TERMINAL_STATES))


def _single_line(value: str) -> str:
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("must not contain control characters (newlines, tabs, NUL)")
    return value


class SubmitRequest(BaseModel):
    """Body of ``POST /submit``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    template: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$", description="Template name, see GET /templates.")
    params: dict[str, Any] = Field(default_factory=dict, description="The template's parameters.")
    gpus: int | None = Field(default=None, ge=1, le=64, description="GPUs on one node; default from the template.")
    gpu_type: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$", examples=["rtx4090"])
    cpus: int | None = Field(default=None, ge=1, le=256)
    mem_gb: int | None = Field(default=None, ge=1, le=4096)
    time_limit_min: int | None = Field(default=None, ge=1)
    container_image: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@#+-]*$",
        description="Must match the operator's allowlist.",
        examples=["nvcr.io#nvidia/pytorch:24.01-py3"],
    )
    name: Annotated[str, AfterValidator(_single_line)] | None = Field(default=None, min_length=1, max_length=128)


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


class TemplateList(BaseModel):
    templates: list[TemplateOut]


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


class UsageOut(BaseModel):
    account: str
    period: str
    currency: str
    gpu_seconds: int
    charges: str = Field(description="Job lines, each rounded to the cent as on the invoice")
    adjustments: str
    total: str = Field(description="Equals the invoice's total line")
    by_gpu_type: list[UsageByType]
    by_day: list[UsageByDay]
    balance: BalanceOut
