"""The operator report: revenue, utilization, queue wait and payback over a window.

Where each figure comes from:
- revenue, GPU-hours sold: the ledger, each row prorated to the seconds of it
  inside the window (rows are exact, so a row wholly inside counts as billed);
  by account, GPU type, price tier (normal or spot: the row's own) and day;
- adjustments: the ``adjustments`` table, apart from revenue;
- utilization: sacct's allocations (``AllocTRES`` GPUs x the seconds of
  [Start, End) inside the window, split over the job's nodes) over what the
  nodes sinfo lists could give: GPUs x seconds, less the time slurmdbd's events
  have a node down or drained (``sacctmgr show event``), as ``sreport`` does;
- queue wait: Start - Submit of every run that started in the window (sacct);
- waiting now: squeue's pending jobs and Slurm's reason;
- idle GPUs: ``idle_gpu_hours``, the GPU-seconds ``gpupool idle check`` measured
  under each job's idle threshold, per job and UTC hour, by account and template,
  and their share of the GPU-hours sold;
- payback: ``node_costs`` (``gpupool node cost set``) and the
  ``electricity_price_per_kwh`` setting, against the revenue of the runs each
  node ran (a ledger run is found in sacct by job id and start).

Money billed (revenue in total, by account, GPU type and tier; adjustments; net)
is what the invoices say: each invoice line rounded to the cent, then summed
(``billing.money.invoiced_cents``), so a month's report and its invoices agree to
the cent. What no invoice line is (revenue by day, payback) stays exact in
nano-units and is rounded only when displayed (table and CSV), half away from zero.

Modules, each importing only those above it:
- ``window``: ``parse_window`` (a UTC month or a range) and how times print;
- ``intervals``: pure arithmetic (overlaps, unions, percentiles, ratios, GPU-hours);
- ``revenue``: the ledger's rows summed every way the report shows them; adjustments;
- ``utilization``: GPU-seconds possible, down and allocated per node and GPU type;
- ``queue_wait``: wait percentiles, and the jobs pending now;
- ``payback``: node costs, electricity and revenue per node;
- ``alerts``, ``idle``: spend alerts sent; idle GPU-seconds (``idle_figures``, pure);
- ``schema``: the pydantic models of the JSON (``GET /admin/report``, its OpenAPI schema);
- ``build``: ``build_report``, which answers a ``ReportOut``;
- ``output``: the terminal table and the CSV.
"""

from billing.report.build import build_report
from billing.report.idle import idle_figures
from billing.report.intervals import gpu_hours, overlap_s, percentile, union_s
from billing.report.output import cents_text, report_csv, report_table
from billing.report.payback import (
    AVERAGE_MONTH_S,
    NodePayback,
    attribute_to_nodes,
    energy_nanos,
    months_to_payback,
    payback_figures,
)
from billing.report.queue_wait import queue_waits
from billing.report.revenue import sum_ledger_rows
from billing.report.schema import ReportOut
from billing.report.utilization import utilization_cells
from billing.report.window import parse_window

__all__ = [
    "AVERAGE_MONTH_S",
    "NodePayback",
    "ReportOut",
    "attribute_to_nodes",
    "build_report",
    "cents_text",
    "energy_nanos",
    "gpu_hours",
    "idle_figures",
    "months_to_payback",
    "overlap_s",
    "parse_window",
    "payback_figures",
    "percentile",
    "queue_waits",
    "report_csv",
    "report_table",
    "sum_ledger_rows",
    "union_s",
    "utilization_cells",
]
