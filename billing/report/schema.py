"""The report (``build_report``'s answer; ``GET /admin/report`` is its JSON) as pydantic models.

They live with the report, not in ``api/``, since billing never imports the API;
``api/openapi.py`` generates the report's schema from ``ReportOut``. Unknown keys
are refused (``extra="forbid"``), so validating a report's JSON checks that the
schema describes every key the report answers, and every key the schema requires.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer

from gpupool.clock import utc_text

Amount = Annotated[str, Field(description="Exact, in the currency (nano-unit precision); round to the cent to display")]
InvoicedAmount = Annotated[
    str,
    Field(description="What the invoices say: each invoice line's amount (its part in the window) rounded to the cent, "
          "half away from zero, then summed"),
]
# An instant as every report and invoice writes one (gpupool.clock.utc_text): UTC, to the second, ending in Z.
Instant = Annotated[dt.datetime, PlainSerializer(utc_text, return_type=str, when_used="json")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReportRevenue(_Model):
    gpu_seconds: int
    amount: InvoicedAmount
    storage: InvoicedAmount = Field(description="Account storage charged (per GiB-month), its invoice lines rounded to the cent")
    adjustments: InvoicedAmount
    net: InvoicedAmount = Field(description="GPU revenue, storage and adjustments: what the window's invoices total")


class ReportStorageByAccount(_Model):
    account: str
    gib_hours: str = Field(description="GiB-hours charged in the window, to three decimals")
    amount: InvoicedAmount


class _Sums(_Model):
    gpu_seconds: int
    amount: Amount


class _Invoiced(_Model):
    gpu_seconds: int
    amount: InvoicedAmount


class ReportRevenueByAccount(_Invoiced):
    account: str


class ReportRevenueByGpuType(_Invoiced):
    gpu_type: str


class ReportRevenueByTier(_Invoiced):
    tier: str = Field(description="The price tier each ledger row was priced at: normal (full price) or spot")


class ReportRevenueByDay(_Sums):
    date: dt.date = Field(description="A UTC day")
    gpu_seconds_by_gpu_type: dict[str, int]


class ReportAdjustment(_Model):
    account: str
    period: str
    kind: str
    reason: str
    amount: InvoicedAmount
    created_at: Instant


class ReportAdjustments(_Model):
    """Credits (negative) and charges, apart from revenue."""

    credits: InvoicedAmount
    charges: InvoicedAmount
    total: InvoicedAmount
    lines: list[ReportAdjustment]


class _Utilization(_Model):
    gpus: int
    allocated_gpu_seconds: int = Field(description="sacct: AllocTRES GPUs x seconds of [Start, End) in the window")
    available_gpu_seconds: int = Field(description="GPUs x seconds, less time down or drained (sacctmgr events)")
    down_gpu_seconds: int
    utilization: str | None = Field(description="allocated / available, 4 decimals; null with nothing available")


class ReportUtilization(_Utilization):
    scope: str


class ReportNodeUtilization(_Utilization):
    node: str
    gpu_types: dict[str, int]
    state: str | None = Field(description="sinfo's state of the node now")


class ReportGpuTypeUtilization(_Utilization):
    gpu_type: str


class ReportWait(_Model):
    jobs: int
    p50_s: int | None
    p95_s: int | None
    max_s: int | None


class ReportWaitByGpuType(ReportWait):
    gpu_type: str


class ReportWaitByAccount(ReportWait):
    account: str


class ReportQueueWait(_Model):
    """Start - Submit (sacct) of the GPU runs that started in the window; nearest-rank percentiles."""

    all: ReportWait
    by_gpu_type: list[ReportWaitByGpuType]
    by_account: list[ReportWaitByAccount]


class ReportWaiting(_Model):
    """One of squeue's pending jobs, with Slurm's reason."""

    slurm_job_id: str
    account: str
    user: str
    gpus: int
    gpu_type: str | None
    reason: str
    submitted_at: Instant | None
    waiting_s: int | None


class ReportPaybackFigures(_Model):
    purchase_price: Amount
    electricity_to_date: Amount
    cost_to_date: Amount = Field(description="Purchase price and electricity since in service")
    revenue_to_date: Amount
    margin_to_date: Amount
    revenue: Amount = Field(description="Of the window")
    electricity: Amount = Field(description="Of the window")
    margin: Amount = Field(description="revenue - electricity, of the window")
    monthly_margin: Amount = Field(description="The window's margin per average month")
    paid_back: bool
    months_to_payback: str | None = Field(description="At the monthly margin; null when it never pays back at this rate")


class ReportNodePayback(ReportPaybackFigures):
    node: str
    in_service_since: Instant
    watts: int


class ReportPayback(_Model):
    """Per node (``gpupool node cost set``) and in total."""

    nodes: list[ReportNodePayback]
    total: ReportPaybackFigures
    electricity_price_per_kwh: Amount
    unattributed_revenue: Amount = Field(description="Revenue of runs sacct has no record of: it counts towards no node")


class ReportAlertsSent(_Model):
    account: str
    kind: str = Field(description="credit (of the prepaid credit) or limit (of the monthly limit)")
    threshold: int = Field(description="Percent of the credit or limit used")
    sent: int = Field(description="How many such alerts the window's billing passes sent (one per period at most)")
    last_sent_at: Instant


class ReportNodeHealth(_Model):
    node: str
    drains: int = Field(description="GPU-check drains (reason \"gpu: ...\") that began in the window, as billing passes saw them")
    hours_drained: str = Field(description="Hours of the window the node spent drained by the GPU check, 2 decimals")
    runs_credited: int = Field(description="Runs a failed GPU on the node ended, credited automatically in the window")
    credited: Amount = Field(description="What those credits gave back, each rounded to the cent as its invoice line")


class _IdleLine(_Model):
    gpu_seconds: int
    gpu_hours: str = Field(description="gpu_seconds / 3600, 2 decimals")


class ReportIdleByAccount(_IdleLine):
    account: str


class ReportIdleByTemplate(_IdleLine):
    template: str


class ReportIdleGpus(_IdleLine):
    """GPU-seconds the idle check measured under each job's idle threshold (its policy's, else the default), in the
    UTC hours that start in the window: between consecutive samples of a GPU at most 5 minutes apart, both under."""

    share_of_gpu_hours_sold: str | None = Field(
        description="gpu_seconds / gpu_seconds_sold, 4 decimals; null with nothing sold. Jobs not billed yet count as idle, not as sold"
    )
    by_account: list[ReportIdleByAccount]
    by_template: list[ReportIdleByTemplate]


class ReportOut(_Model):
    """``GET /admin/report``: amounts are exact decimal text; GPU-seconds are integers.

    ``measured_until`` is min(until, now): nothing after it is counted.
    """

    since: Instant
    until: Instant
    measured_until: Instant
    generated_at: Instant
    currency: str
    revenue: ReportRevenue
    revenue_by_account: list[ReportRevenueByAccount]
    revenue_by_gpu_type: list[ReportRevenueByGpuType]
    revenue_by_tier: list[ReportRevenueByTier]
    revenue_by_day: list[ReportRevenueByDay]
    storage_by_account: list[ReportStorageByAccount] = Field(description="Account storage charged in the window, per account")
    adjustments: ReportAdjustments
    gpu_seconds_sold: int
    gpu_hours_sold: str
    idle_gpus: ReportIdleGpus
    utilization: ReportUtilization
    utilization_by_node: list[ReportNodeUtilization]
    utilization_by_gpu_type: list[ReportGpuTypeUtilization]
    queue_wait: ReportQueueWait
    waiting_now: list[ReportWaiting]
    payback: ReportPayback
    alerts_sent: list[ReportAlertsSent] = Field(description="Spend alerts sent in the window (webhook and email each)")
    node_health: list[ReportNodeHealth] = Field(description="Per node with one in the window: GPU-check drains and GPU-failure credits")
    notes: list[str]
