"""A node's GPU exporter for tests: a recorded nvidia-smi capture served as nvidia_gpu_exporter serves it.

The captures in ../shared/external-data/nvidia-smi/nvidia_gpu_exporter_captures/
are utkuozdemir/nvidia_gpu_exporter's own recordings of ``nvidia-smi
--query-gpu=...`` on real GPUs (one GPU each). ``exporter_text`` turns the
capture's CSV row into that exporter's Prometheus output the way the exporter
does (``nvidia_smi_<field>``, ``[%]`` as a ``_ratio``, ``[MiB]`` as ``_bytes``,
``[W]`` as ``_watts``, uuid labels and ``nvidia_smi_gpu_info``), once per GPU
index asked for, with that index's uuid and the utilization the test chooses:
these machines have emulated GPUs and nothing to scrape.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO
from tests.support.http import QuietHandler, serving

CAPTURES = REPO.parent / "shared" / "external-data" / "nvidia-smi" / "nvidia_gpu_exporter_captures"
H100_CAPTURE = CAPTURES / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
MIB = 1024 * 1024
_UNITS = {"%": ("_ratio", 0.01), "MiB": ("_bytes", float(MIB)), "W": ("_watts", 1.0), "MHz": ("_clock_hz", 1e6)}
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def capture_row(path: Path = H100_CAPTURE, phase: str = "load") -> dict[str, str]:
    """The capture's ``query-gpu`` CSV row (under ``phase``: idle or load), field -> value as nvidia-smi wrote it."""
    section = path.read_text().split(f"# {phase} :: query-gpu (csv, what the exporter parses)", 1)[1]
    lines = [line for line in section.splitlines() if line.strip() and not line.startswith("#")]
    header = [name.strip() for name in lines[0].split(",")]
    values = [value.strip() for value in lines[1].split(",")]
    assert len(header) == len(values), f"{path.name}: a {phase} row of {len(values)} values for {len(header)} fields"
    return dict(zip(header, values, strict=True))


def _metric(field_name: str, raw: str) -> tuple[str, float] | None:
    base, _, unit_part = field_name.partition(" [")
    unit = unit_part.rstrip("]")
    value_text = raw.split(" ", 1)[0]
    if not _NUMBER.match(value_text):
        return None  # [N/A], hex ids, words: the exporter skips them as well
    suffix, factor = _UNITS.get(unit, ("", 1.0))
    name = "nvidia_smi_" + re.sub(r"[^a-z0-9]+", "_", base.lower()).strip("_") + suffix
    return name, float(value_text) * factor


def exporter_text(row: Mapping[str, str], utilization: Mapping[int, float]) -> str:
    """The exporter's answer for GPUs ``utilization``'s keys (indices), each at that utilization in %."""
    uuids = {index: row["uuid"][: -len(str(index))] + str(index) for index in utilization}
    families: dict[str, dict[int, float]] = {}
    for field_name, raw in row.items():
        found = _metric(field_name, raw)
        if found is None:
            continue
        name, value = found
        if name in families:
            continue
        families[name] = dict.fromkeys(utilization, value)
    families["nvidia_smi_utilization_gpu_ratio"] = {index: pct / 100 for index, pct in utilization.items()}
    families["nvidia_smi_index"] = {index: float(index) for index in utilization}
    lines = [
        "# HELP nvidia_smi_gpu_info A metric with a constant '1' value labeled by gpu uuid, name, driver_version.",
        "# TYPE nvidia_smi_gpu_info gauge",
    ]
    lines.extend(
        f'nvidia_smi_gpu_info{{driver_version="{row["driver_version"]}",index="{index}",name="{row["name"]}",uuid="{uuids[index]}"}} 1'
        for index in sorted(utilization)
    )
    for name, values in families.items():
        lines.append(f"# TYPE {name} gauge")
        lines.extend(f'{name}{{uuid="{uuids[index]}"}} {value!r}' for index, value in sorted(values.items()))
    return "\n".join(lines) + "\n"


@dataclass
class FakeNodeExporter:
    """What the served exporter says now: set ``utilization`` (index -> %) between check passes."""

    port: int
    row: dict[str, str]
    utilization: dict[int, float] = field(default_factory=dict)
    scrapes: int = 0

    def body(self) -> bytes:
        return exporter_text(self.row, self.utilization).encode()


@contextmanager
def serve_metrics(scrape: Callable[[], bytes]) -> Iterator[int]:
    """An HTTP server on 127.0.0.1 answering /metrics with what ``scrape`` returns then; yields its port."""

    class Exporter(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = scrape()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving(Exporter) as port:
        yield port


@contextmanager
def serve_exporter(utilization: Mapping[int, float], row: dict[str, str] | None = None) -> Iterator[FakeNodeExporter]:
    """An HTTP server on 127.0.0.1 answering /metrics as a node's nvidia_gpu_exporter would."""
    state = FakeNodeExporter(port=0, row=row or capture_row(), utilization=dict(utilization))

    def scrape() -> bytes:
        state.scrapes += 1
        return state.body()

    with serve_metrics(scrape) as port:
        state.port = port
        yield state
