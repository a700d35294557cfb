"""The report for people: a terminal table and an RFC 4180 CSV, amounts rounded to the cent only here."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from billing.invoice import spreadsheet_text
from billing.money import format_cents, parse_nanos, round_to_cents
from billing.report.intervals import gpu_hours
from billing.report.schema import ReportOut

_NODE_FACTS = ("in_service_since", "watts")


def cents_text(amount: str) -> str:
    """An exact amount as the invoice would print it: to the cent, half away from zero."""
    return format_cents(round_to_cents(parse_nanos(amount)))


def _percent(value: str | None) -> str:
    return "-" if value is None else f"{Decimal(value) * 100:.1f}%"


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(value) if value is not None else "-" for value in row] for row in rows]
    widths = [max(len(str(h)), *(len(row[i]) for row in cells)) if cells else len(str(h)) for i, h in enumerate(header)]
    lines = ["", title]
    lines.append("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    lines.extend("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
    if not cells:
        lines.append("(none)")
    return lines


def report_table(report: ReportOut) -> str:
    """The report for a terminal: amounts rounded to the cent, utilization in percent."""
    data = report.model_dump(mode="json")
    currency = report.currency
    out = [
        f"gpupool report {data['since']} .. {data['until']} (measured until {data['measured_until']}), amounts in {currency}",
        f"revenue {cents_text(data['revenue']['amount'])}, storage {cents_text(data['revenue']['storage'])}, "
        f"adjustments {cents_text(data['revenue']['adjustments'])}, "
        f"net {cents_text(data['revenue']['net'])}; GPU-hours sold {data['gpu_hours_sold']}; "
        f"utilization {_percent(data['utilization']['utilization'])}",
    ]
    idle = data["idle_gpus"]
    out += _table("Revenue by account", ("account", "gpu_hours", "amount"), [(r["account"], gpu_hours(r["gpu_seconds"]), cents_text(r["amount"])) for r in data["revenue_by_account"]])
    out += _table("Revenue by GPU type", ("gpu_type", "gpu_hours", "amount"), [(r["gpu_type"], gpu_hours(r["gpu_seconds"]), cents_text(r["amount"])) for r in data["revenue_by_gpu_type"]])
    out += _table("Revenue by price tier", ("tier", "gpu_hours", "amount"), [(r["tier"], gpu_hours(r["gpu_seconds"]), cents_text(r["amount"])) for r in data["revenue_by_tier"]])
    out += _table("Storage by account", ("account", "gib_hours", "amount"), [(r["account"], r["gib_hours"], cents_text(r["amount"])) for r in data["storage_by_account"]])
    out += _table("Revenue by day (UTC)", ("date", "gpu_hours", "amount"), [(r["date"], gpu_hours(r["gpu_seconds"]), cents_text(r["amount"])) for r in data["revenue_by_day"]])
    adjustments = data["adjustments"]
    out += _table(
        f"Adjustments (credits {cents_text(adjustments['credits'])}, charges {cents_text(adjustments['charges'])})",
        ("account", "period", "kind", "amount", "reason"),
        [(a["account"], a["period"], a["kind"], cents_text(a["amount"]), a["reason"]) for a in adjustments["lines"]],
    )
    out += _table(
        f"Idle GPU-hours (under the idle threshold): {idle['gpu_hours']}, {_percent(idle['share_of_gpu_hours_sold'])} of GPU-hours sold",
        ("by", "name", "gpu_hours", "gpu_seconds"),
        [("account", r["account"], r["gpu_hours"], r["gpu_seconds"]) for r in idle["by_account"]]
        + [("template", r["template"], r["gpu_hours"], r["gpu_seconds"]) for r in idle["by_template"]],
    )
    out += _table(
        "Utilization by node (allocated / available GPU-hours)",
        ("node", "state", "gpus", "allocated", "available", "down", "utilization"),
        [(r["node"], r["state"], r["gpus"], gpu_hours(r["allocated_gpu_seconds"]), gpu_hours(r["available_gpu_seconds"]), gpu_hours(r["down_gpu_seconds"]), _percent(r["utilization"])) for r in data["utilization_by_node"]],
    )
    out += _table(
        "Utilization by GPU type",
        ("gpu_type", "gpus", "allocated", "available", "down", "utilization"),
        [(r["gpu_type"], r["gpus"], gpu_hours(r["allocated_gpu_seconds"]), gpu_hours(r["available_gpu_seconds"]), gpu_hours(r["down_gpu_seconds"]), _percent(r["utilization"])) for r in data["utilization_by_gpu_type"]],
    )
    wait = data["queue_wait"]
    out += _table(
        "Queue wait (start - submit, seconds)",
        ("by", "name", "jobs", "p50", "p95", "max"),
        [("all", "", wait["all"]["jobs"], wait["all"]["p50_s"], wait["all"]["p95_s"], wait["all"]["max_s"])]
        + [("gpu_type", r["gpu_type"], r["jobs"], r["p50_s"], r["p95_s"], r["max_s"]) for r in wait["by_gpu_type"]]
        + [("account", r["account"], r["jobs"], r["p50_s"], r["p95_s"], r["max_s"]) for r in wait["by_account"]],
    )
    out += _table(
        "Waiting now",
        ("job", "account", "gpus", "gpu_type", "waiting_s", "reason"),
        [(j["slurm_job_id"], j["account"], j["gpus"], j["gpu_type"], j["waiting_s"], j["reason"]) for j in data["waiting_now"]],
    )
    payback = data["payback"]
    out += _table(
        f"Payback (electricity {payback['electricity_price_per_kwh']} per kWh; margin = revenue - electricity)",
        ("node", "cost_to_date", "revenue_to_date", "margin_to_date", "window_margin", "per_month", "months_to_payback"),
        [
            (p["node"], cents_text(p["cost_to_date"]), cents_text(p["revenue_to_date"]), cents_text(p["margin_to_date"]), cents_text(p["margin"]), cents_text(p["monthly_margin"]), p["months_to_payback"] or "never at this rate")
            for p in [*payback["nodes"], {"node": "total", **payback["total"]}]
        ] if payback["nodes"] else [],
    )
    out += _table(
        "Spend alerts sent",
        ("account", "kind", "threshold", "sent", "last_sent_at"),
        [(a["account"], a["kind"], f"{a['threshold']}%", a["sent"], a["last_sent_at"]) for a in data["alerts_sent"]],
    )
    out += _table(
        "Node health (GPU check)",
        ("node", "drains", "hours_drained", "runs_credited", "credited"),
        [(h["node"], h["drains"], h["hours_drained"], h["runs_credited"], cents_text(h["credited"])) for h in data["node_health"]],
    )
    out += [f"note: {note}" for note in data["notes"]]
    return "\n".join(out) + "\n"


def report_csv(report: ReportOut) -> str:
    """One RFC 4180 table: section, key, metric, value. Amounts stay exact; text cells never run as formulas."""
    data = report.model_dump(mode="json")
    rows: list[tuple[str, str, str, Any]] = [
        ("window", "since", "time", data["since"]),
        ("window", "until", "time", data["until"]),
        ("window", "measured_until", "time", data["measured_until"]),
        ("window", "currency", "text", data["currency"]),
        *(("revenue", "total", key, value) for key, value in data["revenue"].items()),
        ("gpu_hours_sold", "total", "gpu_hours", data["gpu_hours_sold"]),
        *(("idle_gpus", "total", metric, data["idle_gpus"][metric]) for metric in ("gpu_seconds", "gpu_hours", "share_of_gpu_hours_sold")),
    ]
    for key in ("account", "template"):
        for line in data["idle_gpus"][f"by_{key}"]:
            rows += [(f"idle_gpus_by_{key}", line[key], metric, line[metric]) for metric in ("gpu_seconds", "gpu_hours")]
    for section, key in (
        ("revenue_by_account", "account"), ("revenue_by_gpu_type", "gpu_type"), ("revenue_by_tier", "tier"), ("revenue_by_day", "date"),
    ):
        for line in data[section]:
            rows += [(section, line[key], "gpu_seconds", line["gpu_seconds"]), (section, line[key], "amount", line["amount"])]
    for line in data["storage_by_account"]:
        rows += [("storage_by_account", line["account"], metric, line[metric]) for metric in ("gib_hours", "amount")]
    for key in ("credits", "charges", "total"):
        rows.append(("adjustments", "total", key, data["adjustments"][key]))
    for index, line in enumerate(data["adjustments"]["lines"]):
        rows += [("adjustment", f"{index + 1}", name, line[name]) for name in ("account", "period", "kind", "reason", "amount", "created_at")]
    for section, key in (("utilization_by_node", "node"), ("utilization_by_gpu_type", "gpu_type")):
        for line in data[section]:
            rows += [(section, line[key], name, line[name]) for name in ("gpus", "allocated_gpu_seconds", "available_gpu_seconds", "down_gpu_seconds", "utilization")]
    wait = data["queue_wait"]
    scopes = [("all", wait["all"])]
    scopes += [(f"gpu_type:{line['gpu_type']}", line) for line in wait["by_gpu_type"]]
    scopes += [(f"account:{line['account']}", line) for line in wait["by_account"]]
    for scope, line in scopes:
        rows += [("queue_wait", scope, metric, line[metric]) for metric in ("jobs", "p50_s", "p95_s", "max_s")]
    for job in data["waiting_now"]:
        rows += [("waiting_now", job["slurm_job_id"], name, job[name]) for name in ("account", "gpus", "gpu_type", "reason", "waiting_s")]
    for line in [*data["payback"]["nodes"], {"node": "total", **data["payback"]["total"]}] if data["payback"]["nodes"] else []:
        # A node's own facts first, then its figures (the model lists the shared figures first).
        names = [*(name for name in _NODE_FACTS if name in line), *(name for name in line if name not in (*_NODE_FACTS, "node"))]
        rows += [("payback", line["node"], name, line[name]) for name in names]
    for line in data["alerts_sent"]:
        key = f"{line['account']}:{line['kind']}:{line['threshold']}"
        rows += [("alerts_sent", key, "sent", line["sent"]), ("alerts_sent", key, "last_sent_at", line["last_sent_at"])]
    for line in data["node_health"]:
        rows += [("node_health", line["node"], name, line[name]) for name in ("drains", "hours_drained", "runs_credited", "credited")]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(("section", "key", "metric", "value"))
    for section, key, metric, value in rows:
        cell = "" if value is None else value
        writer.writerow((section, spreadsheet_text(str(key)), metric, spreadsheet_text(cell) if isinstance(cell, str) and metric in ("reason", "text", "account") else cell))
    return buffer.getvalue()
