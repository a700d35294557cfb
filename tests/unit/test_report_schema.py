"""The report built whole on the unit fixtures of test_report (a fake session and Slurm client: no
database, no cluster): its JSON, table and CSV against goldens written before billing/report.py was
carved into a package, and its JSON against the pydantic models the OpenAPI schema is generated from.

The goldens' money billed (revenue, adjustments, net) changed once since, on purpose: it is the
invoices' own figure, each line rounded to the cent (issue 35); and the node health section was
added to them (issue 35). Goldens live in tests/unit/golden_report/; ``GPUPOOL_UPDATE_GOLDEN=1`` rewrites them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from api.openapi import openapi_document
from billing.report import ReportOut, build_report, parse_window, report_csv, report_table
from gpupool.slurm.report import (
    Allocation,
    NodeEvent,
    NodeGpuCapacity,
    PendingJob,
    parse_allocations,
    parse_node_events,
    parse_node_gpus,
    parse_pending,
)
from tests import golden
from tests.unit.test_report import EVENTS, SACCT, SINFO, utc

GOLDEN_DIR = Path(__file__).parent / "golden_report"
NOW = utc("2026-11-02T12:00:00")
PENDING = (
    "JOBID|ACCOUNT|USER|SUBMIT_TIME|REASON|NODES|TRES_PER_NODE|TRES_PER_JOB|\n"
    "1188|acme|gp-acme|2026-11-02T11:23:56|Resources|2|gres:gpu:rtx4090:2|N/A|\n"
    "1189|=beta|gp-beta|2026-11-02T11:23:57|QOSGrpGRES|1|N/A|gres:gpu:3|\n"
)
FULL, SPOT = 120_000, 40_000
# (account, type, GPUs, from, to, seconds, GPU-seconds, price, amount, job id, run start, tier): runs 10-12 of SACCT,
# 12 across midnight, and 99, which sacct has no record of.
LEDGER = [
    ("acme", "rtx4090", 2, utc("2026-11-02T10:00:00"), utc("2026-11-02T10:30:00"), 1800, 3600, FULL, 3600 * FULL, 10, utc("2026-11-02T10:00:00"), "normal"),
    ("acme", "rtx3090", 1, utc("2026-11-02T10:15:00"), utc("2026-11-02T10:45:00"), 1800, 1800, FULL, 1800 * FULL, 11, utc("2026-11-02T10:15:00"), "spot"),
    ("beta", "rtx4090", 4, utc("2026-11-02T11:00:00"), utc("2026-11-03T00:30:00"), 48600, 194400, SPOT, 194400 * SPOT, 12, utc("2026-11-02T11:00:00"), "spot"),
    ("zed", "rtx4090", 1, utc("2026-11-02T10:00:00"), utc("2026-11-02T10:00:10"), 10, 10, 5, 50, 99, utc("2026-11-02T10:00:00"), "normal"),
]
# (account, period, kind, reason, amount, created at): a reason a spreadsheet would run as a formula.
ADJUSTMENTS = [
    ("acme", "2026-11", "credit", "=sorry", -2_500_000_000, utc("2026-11-02T10:20:00")),
    ("beta", "2026-11", "charge", "setup", 1_005_000_000, utc("2026-11-02T11:20:00")),
]
# (account, kind, threshold, count, last sent): spend alerts of the window's billing passes.
ALERTS = [
    ("acme", "credit", 50, 1, utc("2026-11-02T10:31:00")),
    ("acme", "credit", 80, 1, utc("2026-11-02T10:46:00")),
]
# (account, template, idle GPU-seconds) of the window's idle_gpu_hours rows; fractions from stretches split at an hour.
IDLE = [
    ("acme", "hello", 1800.0),
    ("acme", "jupyter", 599.6),
    ("beta", "hello", 3600.0),
]
# GPU-check drains (node_health_events) and GPU-failure credits (their reasons name the node): node a
# drained 09:00 to 11:30, inside the month and half inside the range case's window.
DRAINS = [SimpleNamespace(node="a", drained_at=utc("2026-11-02T09:00:00"), resumed_at=utc("2026-11-02T11:30:00"))]
GPU_CREDITS = [
    ("automatic credit: job 10 ended by a GPU failure (gpu_failure: Xid 79 on 0000:41:00.0 (node a))", -432_000_000),
    ("automatic credit: job 11 ended by a GPU failure (gpu_failure: 0000:42:00.0 is lost (fallen off the bus) (node a))", -6_000_000),
]
NODE_COSTS = [
    SimpleNamespace(node="a", purchase_price_nanos=40_000 * 10**9, in_service_since=utc("2026-10-01T00:00:00"), watts=2330),
    SimpleNamespace(node="b", purchase_price_nanos=100 * 10**9, in_service_since=utc("2026-11-02T09:00:00"), watts=900),
]


# Storage charges (account, period, price per GiB-month, byte-seconds, nanos): 1000 GiB for an hour
# at 0.072 per GiB-month is 0.10; the second hour lies outside the range case's window.
STORAGE = [
    ("acme", "2026-11", 72_000_000, 1000 * 1024**3 * 3600, 100_000_000),
    ("acme", "2026-11", 72_000_000, 1000 * 1024**3 * 1800, 50_000_000),
]
STORAGE_STARTS = [utc("2026-11-02T10:00:00"), utc("2026-11-20T10:00:00")]


class FakeSession:
    """What build_report reads of a session: node costs, ledger rows, adjustments, alerts, idle GPU-seconds."""

    def __init__(self, costs: Iterable[SimpleNamespace]) -> None:
        self.costs = list(costs)

    def scalars(self, query: Any) -> list[SimpleNamespace]:
        return list(DRAINS) if "node_health_events" in str(query) else self.costs

    def connection(self) -> SimpleNamespace:
        return SimpleNamespace(execute=lambda _query, execution_options=None: list(LEDGER))

    def execute(self, query: Any) -> list[tuple[Any, ...]]:
        text = str(query)
        if "idle_gpu_hours" in text:
            return list(IDLE)
        if "adjustments.kind =" in text:
            return list(GPU_CREDITS)
        if "storage_charges" in text:
            since, end = sorted(value for value in query.compile().params.values() if isinstance(value, dt.datetime))
            return [row for row, start in zip(STORAGE, STORAGE_STARTS, strict=True) if since <= start < end]
        return list(ALERTS) if "alerts_sent" in text else list(ADJUSTMENTS)


class FakeSlurm:
    def node_gpus(self) -> list[NodeGpuCapacity]:
        return parse_node_gpus(SINFO)

    def allocations(self, _start: dt.datetime, _end: dt.datetime) -> list[Allocation]:
        return parse_allocations(SACCT)

    def node_events(self, _start: dt.datetime, _end: dt.datetime) -> list[NodeEvent]:
        return parse_node_events(EVENTS)

    def pending_jobs(self) -> list[PendingJob]:
        return parse_pending(PENDING)


CASES = {
    "month": (NODE_COSTS, parse_window("2026-11", now=NOW)),
    "range-no-costs": ([], parse_window(since="2026-11-02T10:00:00", until="2026-11-02T13:00:00", now=NOW)),
}


def report(case: str) -> ReportOut:
    costs, (since, until) = CASES[case]
    settings = SimpleNamespace(currency="EUR", electricity_price_per_kwh="0.30")
    return build_report(FakeSession(costs), FakeSlurm(), settings, since, until, NOW)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", sorted(CASES))
def test_json_table_and_csv_are_those_of_the_report_before_the_carve(case: str) -> None:
    built = report(case)
    golden.check_golden(GOLDEN_DIR, f"{case}.json", json.dumps(built.model_dump(mode="json"), indent=1) + "\n")
    golden.check_golden(GOLDEN_DIR, f"{case}.txt", report_table(built))
    csv_text = report_csv(built)
    assert csv_text.endswith("\r\n") and "\n" not in csv_text.replace("\r\n", "")  # RFC 4180 line ends
    golden.check_golden(GOLDEN_DIR, f"{case}.csv", csv_text.replace("\r\n", "\n"))  # read back in text mode


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_report_json_validates_against_its_model(case: str) -> None:
    answered = report(case).model_dump(mode="json")
    ReportOut.model_validate(answered)
    # Every key is described: one the model lacks is refused, and so is one the report left out.
    with pytest.raises(ValidationError):
        ReportOut.model_validate({**answered, "queue_wait": {**answered["queue_wait"], "p99_s": 1}})
    with pytest.raises(ValidationError):
        ReportOut.model_validate({key: value for key, value in answered.items() if key != "revenue_by_tier"})


def test_the_openapi_schema_of_the_report_is_generated_from_the_model() -> None:
    document = openapi_document({})
    ok = document["paths"]["/admin/report"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/ReportOut"}
    schemas = document["components"]["schemas"]
    expected = ReportOut.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, schema in expected.pop("$defs").items():
        assert schemas[name] == schema
    assert schemas["ReportOut"] == expected
    assert schemas["ReportRevenueByTier"]["required"] == ["gpu_seconds", "amount", "tier"]
