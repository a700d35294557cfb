"""``gpupool top``: running jobs, the GPUs they hold, and what those GPUs are doing.

Jobs and GPU indices come from one ``scontrol show job --details`` call; each
GPU's utilization, memory, temperature and power from its node's GPU exporter
(``http://<node>:<gpu_exporter_port>/metrics``, or the ``gpu_exporter_url`` setting) or, per node, from a saved
scrape given with ``--metrics-file NODE=FILE``. A node whose exporter cannot be
read shows ``n/a`` for its GPUs and says why below the table.

GPUs an exporter reports that no job holds are listed too, with ``-`` for the
job: a busy GPU there is work running outside Slurm. Nodes out of service
(drained, down) are listed below the table with Slurm's reason and since when:
``gpu: ...`` is the GPU health check's (``gpupool node resume`` brings one back).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpupool import db
from gpupool.config import Settings
from gpupool.errors import SlurmUnavailable
from gpupool.gpu_usage.exporter import GpuReading, NodeMetrics, node_metrics_from_text, scrape_cluster
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.detail import RunningJob
from gpupool.slurm.report import NodeReason

NA = "n/a"
CLEAR_SCREEN = "\x1b[H\x1b[2J"
COLUMNS = ("JOB", "ACCOUNT", "USER", "NODE", "GPU", "UTIL", "MEMORY", "TEMP", "POWER", "MODEL")
_RIGHT_ALIGNED = frozenset({"GPU", "UTIL", "MEMORY", "TEMP", "POWER"})


def _printable(text: str) -> str:
    """Names reach the terminal verbatim otherwise: no escape sequences from a job or an exporter."""
    return "".join(char if char.isprintable() else "?" for char in text)


def _number(value: float | None, unit: str) -> str:
    return NA if value is None else f"{value:.0f}{unit}"


def _memory(reading: GpuReading) -> str:
    used, total = reading.memory_used_mib, reading.memory_total_mib
    if used is None and total is None:
        return NA
    shown = ["?" if value is None else f"{value / 1024:.1f}" for value in (used, total)]
    return f"{shown[0]}/{shown[1]} GiB"


def _gpu_cells(node: NodeMetrics | None, index: int) -> list[str]:
    reading = node.gpus.get(index) if node is not None and node.error is None else None
    if reading is None:
        return [NA, NA, NA, NA, ""]
    return [
        _number(reading.utilization_pct, "%"),
        _memory(reading),
        _number(reading.temperature_c, "C"),
        _number(reading.power_w, "W"),
        _printable(reading.model or ""),
    ]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if name in _RIGHT_ALIGNED else cell.ljust(width)
            for name, cell, width in zip(COLUMNS, row, widths, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _out_of_service_lines(nodes: Sequence[NodeReason]) -> list[str]:
    lines = []
    for node in sorted((node for node in nodes if node.out_of_service), key=lambda node: node.name):
        since = f" since {node.reason_changed_at:%Y-%m-%d %H:%M} UTC" if node.reason_changed_at is not None else ""
        reason = _printable(node.reason) or "no reason given"
        lines.append(f"{_printable(node.name)}: {_printable(node.state.lower())}{since}: {reason}")
    return lines


def render_top(
    jobs: Sequence[RunningJob], metrics: Mapping[str, NodeMetrics], *, now: dt.datetime, nodes: Sequence[NodeReason] = (),
) -> str:
    """The whole view as plain text: a pure function of what Slurm and the exporters said."""
    jobs = [job for job in jobs if job.gpus]
    held = sum(job.gpu_count for job in jobs)
    plural = "" if len(jobs) == 1 else "s"
    header = f"gpupool top  {now.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC  {len(jobs)} job{plural} running on {held} GPU(s)"
    rows: list[list[str]] = [list(COLUMNS)]
    taken: set[tuple[str, int]] = set()
    for job in sorted(jobs, key=lambda job: job.slurm_job_id):
        for alloc in sorted(job.gpus, key=lambda alloc: alloc.node):
            for index in alloc.indices:
                taken.add((alloc.node, index))
                rows.append(
                    [_printable(job.display_id), _printable(job.account), _printable(job.user),
                     _printable(alloc.node), str(index), *_gpu_cells(metrics.get(alloc.node), index)]
                )
    for name in sorted(metrics):
        node = metrics[name]
        for index in sorted(node.gpus) if node.error is None else ():
            if (name, index) not in taken:
                rows.append(["-", "-", "-", _printable(name), str(index), *_gpu_cells(node, index)])
    lines = [header, "", *_table(rows)]
    failing = [metrics[name] for name in sorted(metrics) if metrics[name].error is not None]
    if failing:
        lines.append("")
        lines.extend(f"{_printable(node.node)}: GPU metrics {NA}: {_printable(node.error or '')}" for node in failing)
    out_of_service = _out_of_service_lines(nodes)
    if out_of_service:
        lines += ["", "Out of service:", *(f"  {line}" for line in out_of_service)]
    return "\n".join(lines) + "\n"


def _read_metrics_file(node: str, path: Path) -> NodeMetrics:
    try:
        return node_metrics_from_text(node, path.read_text(errors="replace"))
    except OSError as exc:
        return NodeMetrics(node, error=f"cannot read {path}: {exc.strerror or exc}")


def collect_metrics(jobs: Sequence[RunningJob], settings: Settings, files: Mapping[str, Path]) -> dict[str, NodeMetrics]:
    """Saved scrapes for the nodes given files; every other node a job runs on, from its exporter."""
    metrics = {node: _read_metrics_file(node, path) for node, path in files.items()}
    to_scrape = {alloc.node for job in jobs for alloc in job.gpus} - set(files)
    metrics.update(scrape_cluster(to_scrape, settings))
    return metrics


def snapshot(slurm: SlurmClient, settings: Settings, files: Mapping[str, Path]) -> str:
    jobs = slurm.running_gpu_jobs()
    return render_top(jobs, collect_metrics(jobs, settings, files), now=db.utcnow(), nodes=slurm.node_reasons())


def cmd_top(settings: Settings, args: argparse.Namespace) -> int:
    slurm = SlurmClient(settings)
    files = dict(args.metrics_file)
    if args.once:
        sys.stdout.write(snapshot(slurm, settings, files))
        return 0
    try:
        while True:
            try:
                frame = snapshot(slurm, settings, files)
            except SlurmUnavailable as exc:
                # A live view outlasts a Slurm blip: say so and try again next round.
                frame = f"gpupool top  {db.utcnow():%Y-%m-%d %H:%M:%S} UTC\n\nSlurm: {exc.message}\n"
            sys.stdout.write(CLEAR_SCREEN + frame)
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from exc
    if not seconds > 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return seconds


def _node_file(value: str) -> tuple[str, Path]:
    node, sep, path = value.partition("=")
    if not sep or not node or not path:
        raise argparse.ArgumentTypeError(f"{value!r} is not NODE=FILE")
    if not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{path}: no such file")
    return node, Path(path)


def add_top_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = sub.add_parser("top", help="running jobs, their GPUs and those GPUs' load, refreshed")
    top.add_argument("--interval", type=_positive_seconds, default=3.0, help="seconds between refreshes (default 3)")
    top.add_argument("--once", action="store_true", help="print one snapshot as plain text and exit")
    top.add_argument(
        "--metrics-file", type=_node_file, action="append", default=[], metavar="NODE=FILE",
        help="read NODE's GPU metrics from a saved exporter scrape instead of its exporter (repeatable)",
    )
    top.set_defaults(handler=cmd_top)
