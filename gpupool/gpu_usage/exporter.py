"""Per-GPU readings from a node's GPU exporter, in Prometheus text format.

Two exporters are understood, and a scrape may come from either:

* NVIDIA dcgm-exporter (default port 9400): ``DCGM_FI_DEV_GPU_UTIL`` (%),
  ``DCGM_FI_DEV_FB_USED`` / ``_FB_FREE`` / ``_FB_RESERVED`` (MiB),
  ``DCGM_FI_DEV_GPU_TEMP`` (C), ``DCGM_FI_DEV_POWER_USAGE`` (W), one series per
  GPU labelled ``gpu="<index>"`` and ``modelName``;
* utkuozdemir/nvidia_gpu_exporter (nvidia-smi based, default port 9835):
  ``nvidia_smi_utilization_gpu_ratio`` (0-1), ``nvidia_smi_memory_used_bytes``,
  ``nvidia_smi_memory_total_bytes``, ``nvidia_smi_temperature_gpu``,
  ``nvidia_smi_power_draw_watts``, labelled by ``uuid`` only; the index and
  model come from ``nvidia_smi_gpu_info{uuid, index, name}``.

Indices are the exporters' (NVML's, in PCI bus order). They are the indices
Slurm prints as ``IDX`` when gres.conf lists the devices in that order, as
``AutoDetect=nvml`` and a ``File=/dev/nvidia[0-N]`` line both do.

Each node's exporter is at ``exporter_url(settings, node)``: the
``gpu_exporter_url`` setting with ``{node}`` (and ``{port}``) filled in, or
``http://<node>:<gpu_exporter_port>/metrics`` when that is empty. ``gpupool top``
and the idle check (``gpupool.gpu_usage.idle``) both read them.

Parsing is pure; ``scrape_node`` is the one function that talks to the network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gpupool.config import Settings
from gpupool.http import FetchFailed, fetch

MIB = 1024 * 1024
_MAX_SCRAPE_BYTES = 16 * MIB

# metric name -> (reading field, factor to the reading's unit)
_DCGM = {
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("memory_used_mib", 1.0),
    "DCGM_FI_DEV_FB_FREE": ("memory_free_mib", 1.0),
    "DCGM_FI_DEV_FB_RESERVED": ("memory_reserved_mib", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
}
_NVIDIA_SMI = {
    "nvidia_smi_utilization_gpu_ratio": ("utilization_pct", 100.0),
    "nvidia_smi_memory_used_bytes": ("memory_used_mib", 1.0 / MIB),
    "nvidia_smi_memory_total_bytes": ("memory_total_mib", 1.0 / MIB),
    "nvidia_smi_temperature_gpu": ("temperature_c", 1.0),
    "nvidia_smi_power_draw_watts": ("power_w", 1.0),
}


class MetricsParseError(ValueError):
    """The text is not Prometheus exposition format."""


@dataclass(frozen=True)
class GpuReading:
    index: int
    model: str | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class NodeMetrics:
    """One node's GPUs by index, or why they could not be read."""

    node: str
    gpus: Mapping[int, GpuReading] = field(default_factory=dict)
    error: str | None = None


def _value(raw: float) -> float | None:
    return None if math.isnan(raw) or math.isinf(raw) else float(raw)


def _index(label: str | None) -> int | None:
    return int(label) if label is not None and label.isdigit() else None


def parse_gpu_metrics(text: str) -> dict[int, GpuReading]:
    """Readings by GPU index from one exporter scrape; GPUs or values it lacks stay absent/None."""
    values: dict[int, dict[str, float | None]] = {}
    models: dict[int, str] = {}
    by_uuid: dict[str, dict[str, float | None]] = {}
    uuid_index: dict[str, int] = {}
    uuid_model: dict[str, str] = {}
    try:
        samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError as exc:
        raise MetricsParseError(f"not Prometheus text: {exc}") from exc
    for sample in samples:
        labels = sample.labels
        if sample.name in _DCGM:
            index = _index(labels.get("gpu"))
            # MIG instances repeat the GPU's index; the whole device is the series without one.
            if index is None or labels.get("GPU_I_ID"):
                continue
            name, factor = _DCGM[sample.name]
            raw = _value(sample.value)
            values.setdefault(index, {})[name] = None if raw is None else raw * factor
            if labels.get("modelName"):
                models[index] = labels["modelName"]
        elif sample.name in _NVIDIA_SMI and labels.get("uuid"):
            name, factor = _NVIDIA_SMI[sample.name]
            raw = _value(sample.value)
            by_uuid.setdefault(labels["uuid"], {})[name] = None if raw is None else raw * factor
        elif sample.name == "nvidia_smi_gpu_info" and labels.get("uuid"):
            index = _index(labels.get("index"))
            if index is not None:
                uuid_index[labels["uuid"]] = index
            if labels.get("name"):
                uuid_model[labels["uuid"]] = labels["name"]
        elif sample.name == "nvidia_smi_index" and labels.get("uuid") and _value(sample.value) is not None:
            uuid_index.setdefault(labels["uuid"], int(sample.value))
    for uuid, readings in by_uuid.items():
        if uuid in uuid_index:
            values.setdefault(uuid_index[uuid], {}).update(readings)
            if uuid in uuid_model:
                models[uuid_index[uuid]] = uuid_model[uuid]
    return {index: _reading(index, models.get(index), got) for index, got in sorted(values.items())}


def _reading(index: int, model: str | None, got: Mapping[str, float | None]) -> GpuReading:
    total = got.get("memory_total_mib")
    used, free = got.get("memory_used_mib"), got.get("memory_free_mib")
    if total is None and used is not None and free is not None:
        # dcgm-exporter reports what is used and free (and reserved, on newer drivers), not the size.
        total = used + free + (got.get("memory_reserved_mib") or 0.0)
    return GpuReading(
        index=index,
        model=model,
        utilization_pct=got.get("utilization_pct"),
        memory_used_mib=used,
        memory_total_mib=total,
        temperature_c=got.get("temperature_c"),
        power_w=got.get("power_w"),
    )


def node_metrics_from_text(node: str, text: str) -> NodeMetrics:
    try:
        return NodeMetrics(node, parse_gpu_metrics(text))
    except MetricsParseError as exc:
        return NodeMetrics(node, error=str(exc))


def exporter_url(settings: Settings, node: str) -> str:
    """Where ``node``'s exporter answers: the ``gpu_exporter_url`` template, or the port on the node's name."""
    template = settings.gpu_exporter_url or "http://{node}:{port}/metrics"
    return template.format(node=node, port=settings.gpu_exporter_port)


def scrape_node(node: str, url: str, timeout_s: float) -> NodeMetrics:
    """One node's exporter over HTTP; an unreachable or broken exporter is an error, not an exception."""
    try:
        answer = fetch(url, timeout_s=timeout_s, max_bytes=_MAX_SCRAPE_BYTES)
    except FetchFailed as exc:
        return NodeMetrics(node, error=str(exc))
    if answer.status != 200:
        return NodeMetrics(node, error=f"{url} answered HTTP {answer.status}")
    return node_metrics_from_text(node, answer.body.decode("utf-8", errors="replace"))


def scrape_nodes(nodes: Iterable[str], url_of: Callable[[str], str], timeout_s: float) -> dict[str, NodeMetrics]:
    """Every node at once (``url_of(node)``: its exporter), so one dead node costs one timeout, not one per node."""
    wanted = sorted(set(nodes))
    if not wanted:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(wanted))) as pool:
        return dict(zip(wanted, pool.map(lambda node: scrape_node(node, url_of(node), timeout_s), wanted), strict=True))


def scrape_cluster(nodes: Iterable[str], settings: Settings) -> dict[str, NodeMetrics]:
    """Every node's exporter, where the settings say it is."""
    return scrape_nodes(nodes, lambda node: exporter_url(settings, node), settings.gpu_exporter_timeout_s)
