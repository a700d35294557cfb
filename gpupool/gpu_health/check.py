"""The GPU health verdict: what a node has and reports, against what gres.conf promised.

Pure: every function takes text or facts and returns findings; nothing here
runs a program or reads a file (``probe`` does). A finding either warns (the
check prints it and the node keeps taking jobs) or drains (the node takes no
new jobs; those running finish, and an operator resumes it once satisfied).

Xid events (the NVIDIA driver's kernel-log lines ``NVRM: Xid (PCI:0000:41:00): 79, ...``)
are judged by ``XID_RULES``; an Xid not in the table warns. The table, and
why each entry drains or only warns, is in docs/operator-guide.md.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

DRAIN, WARN = "drain", "warn"


@dataclass(frozen=True)
class XidRule:
    action: str
    meaning: str


# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) names a resolution per Xid; an Xid that
# needs a GPU reset or hardware service drains, one that ends only the application that hit it warns.
XID_RULES: Mapping[int, XidRule] = {
    48: XidRule(DRAIN, "double-bit ECC error"),
    # A recorded remap or retirement takes effect at the next GPU reset; the card's
    # remapped_rows.pending flag (below) drains until then where it reports one.
    63: XidRule(WARN, "ECC page retirement or row remapping recorded, active after a GPU reset"),
    64: XidRule(DRAIN, "ECC page retirement or row remapping failed"),
    74: XidRule(DRAIN, "NVLink error"),
    79: XidRule(DRAIN, "GPU has fallen off the bus"),
    92: XidRule(WARN, "high single-bit ECC error rate"),
    94: XidRule(WARN, "contained ECC error: the application using that memory was ended, the GPU goes on"),
    95: XidRule(DRAIN, "uncontained ECC error: every application on the GPU is affected, the GPU needs a reset"),
    119: XidRule(DRAIN, "GSP RPC timeout: the GPU's system processor stopped answering"),
}
UNKNOWN_XID = XidRule(WARN, "Xid gpupool has no rule for")
# Every reason the check drains a node with starts so (billing.node_health reads the check's drains by it).
DRAIN_REASON_PREFIX = "gpu: "

# clocks_throttle_reasons.active bits that mean the hardware is protecting itself. The
# software power cap (0x4) is how a loaded card normally runs, and idle (0x1) is idle.
HARDWARE_THROTTLE_BITS: Mapping[int, str] = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}

_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): (?P<xid>\d+)\b")
_BUS_IN_TEXT = re.compile(r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)")
_LOST_MARKERS = ("gpu is lost", "fallen off the bus")
_MISSING_VALUES = {"", "[n/a]", "n/a", "[not supported]", "[unknown error]"}
_RANGE = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<ranges>[0-9,\-]+)\](?P<suffix>[^\[\]]*)$")


@dataclass(frozen=True)
class Thresholds:
    """The operator's limits (the check's config file; the playbook renders it from role defaults)."""

    temperature_warn_c: float = 85.0
    temperature_drain_c: float = 95.0
    # Hardware throttling warns at once and drains once seen on this many checks in a row.
    throttle_drain_after_checks: int = 3


@dataclass(frozen=True)
class GpuReading:
    """One row of ``nvidia-smi --query-gpu``; None where the card does not report the value."""

    index: int | None
    bus_id: str | None
    name: str | None = None
    temperature_c: float | None = None
    uncorrected_volatile_ecc: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    hardware_throttle: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        if self.bus_id:
            return self.bus_id
        return f"GPU {self.index}" if self.index is not None else "a GPU"


@dataclass(frozen=True)
class XidEvent:
    xid: int
    bus_id: str
    line: str


@dataclass(frozen=True)
class NvidiaSmiResult:
    """What running nvidia-smi gave: its output, or why there is none."""

    stdout: str = ""
    stderr: str = ""
    returncode: int = 0
    timed_out: bool = False
    missing: bool = False


@dataclass(frozen=True)
class Facts:
    """Everything ``probe`` gathered on the node in one run."""

    promised_devices: Sequence[str]
    missing_devices: Sequence[str]
    nvidia_smi: NvidiaSmiResult
    xid_events: Sequence[XidEvent] = ()
    # gres.conf could not be read: nvidia-smi's answer is still judged, against no promise.
    gres_conf_error: str | None = None


@dataclass(frozen=True)
class Finding:
    action: str
    reason: str
    # The GPU a failing finding is about (its bus id, or the device file gres.conf names), when it names
    # one and the GPU can no longer run a job (lost, an Xid that drains, uncorrectable ECC, remap failed,
    # its device file gone): jobs holding it are ended (gpupool.gpu_health.jobs). A hot or throttling
    # GPU still computes; its jobs finish.
    failed_gpu: str | None = field(default=None, compare=False)
    xid: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Verdict:
    findings: tuple[Finding, ...]
    # Per GPU label, how many checks in a row have seen it throttle in hardware (kept in the state file).
    throttle_streaks: Mapping[str, int] = field(default_factory=dict)

    @property
    def drains(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.action == DRAIN]

    @property
    def warnings(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.action == WARN]

    @property
    def drain_reason(self) -> str | None:
        """What Slurm shows as the node's reason: ``gpu: <first cause>``, and how many more.

        A failed GPU comes first when there is one: billing reads it back from the reason
        (``failed_gpu_in_drain_reason``) to credit runs that died of it before this check ran.
        """
        drains = sorted(self.drains, key=lambda finding: finding.failed_gpu is None)
        if not drains:
            return None
        more = f" (+{len(drains) - 1} more)" if len(drains) > 1 else ""
        return f"{DRAIN_REASON_PREFIX}{drains[0].reason}{more}"


# The check's own drain reasons that name a GPU that can no longer run a job, as the findings below
# word them (a test round-trips each): (pattern, whether the GPU group must look like a bus id).
_FAILED_GPU_REASONS = (
    (re.compile(r"(?P<gpu>/\S+) missing \(gres\.conf names it\)"), False),
    (re.compile(r"Xid (?P<xid>\d+) on (?P<gpu>\S+)"), True),
    (re.compile(r"(?P<gpu>\S+) is lost \(fallen off the bus\)"), True),
    (re.compile(r"\d+ uncorrectable ECC error\(s\) on (?P<gpu>\S+)"), True),
    (re.compile(r"row remapping failed on (?P<gpu>\S+)"), True),
)
_MORE = re.compile(r" \(\+\d+ more\)$")


def failed_gpu_in_drain_reason(reason: str) -> tuple[str, int | None] | None:
    """``(gpu, xid)`` when a drain reason this check wrote names a failed GPU first; None for any other reason.

    Whole-reason matches of the check's own wording, never a search in free text: an operator's
    reason, a hot or throttling GPU, or a hung nvidia-smi gives None.
    """
    if not reason.startswith(DRAIN_REASON_PREFIX):
        return None
    cause = _MORE.sub("", reason[len(DRAIN_REASON_PREFIX):])
    for pattern, bus_only in _FAILED_GPU_REASONS:
        match = pattern.fullmatch(cause)
        if match is None:
            continue
        gpu = match["gpu"]
        if bus_only and not _BUS_IN_TEXT.fullmatch(gpu):
            return None
        xid = int(match["xid"]) if "xid" in pattern.groupindex else None
        if xid is not None and XID_RULES.get(xid, UNKNOWN_XID).action != DRAIN:
            return None
        return gpu, xid
    return None


# -- gres.conf -----------------------------------------------------------------


def expand_file_value(value: str) -> list[str]:
    """One path per device, as Slurm expands them: /dev/nvidia[0-1,3] -> /dev/nvidia0 /dev/nvidia1 /dev/nvidia3."""
    paths: list[str] = []
    for item in re.split(r",(?![^\[]*\])", value):
        match = _RANGE.match(item)
        if not match:
            paths.append(item)
            continue
        for part in match.group("ranges").split(","):
            first, _, last = part.partition("-")
            width = len(first) if first.startswith("0") and len(first) > 1 else 0
            for number in range(int(first), int(last or first) + 1):
                paths.append(f"{match.group('prefix')}{number:0{width}d}{match.group('suffix')}")
    return paths


def promised_gpu_devices(gres_conf: str, node_name: str) -> list[str]:
    """The device files gres.conf promises this node's GPUs at: ``Name=gpu`` lines for it (or for every node)."""
    devices: list[str] = []
    for raw in gres_conf.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = {key.lower(): value for key, _, value in (word.partition("=") for word in line.split()) if value}
        if words.get("name") != "gpu" or "file" not in words:
            continue
        if "nodename" in words and node_name not in expand_file_value(words["nodename"]):
            continue
        devices.extend(expand_file_value(words["file"]))
    return devices


# -- nvidia-smi ------------------------------------------------------------------


def normalise_bus_id(text: str) -> str:
    """``00000000:41:00.0`` (nvidia-smi), ``0000:41:00`` (the kernel's Xid line) -> ``0000:41:00.0``."""
    domain, bus, rest = text.lower().split(":", 2)
    device, _, function = rest.partition(".")
    return f"{domain[-4:].rjust(4, '0')}:{bus}:{device}.{function or '0'}"


def _value(row: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = row.get(name)
        if value is not None and value.strip().lower() not in _MISSING_VALUES:
            return value.strip()
    return None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def _flag(text: str | None) -> bool | None:
    if text is None:
        return None
    lowered = text.lower()
    if lowered in {"yes", "active", "1", "true"}:
        return True
    if lowered in {"no", "not active", "0", "false"}:
        return False
    return None


def _hardware_throttle(row: Mapping[str, str]) -> tuple[str, ...]:
    mask_text = _value(row, "clocks_throttle_reasons.active", "clocks_event_reasons.active")
    if mask_text is not None:
        try:
            mask = int(mask_text, 16)
        except ValueError:
            mask = 0
        return tuple(name for bit, name in HARDWARE_THROTTLE_BITS.items() if mask & bit)
    # No bitmask asked for: the per-reason columns, where the query has them.
    return tuple(
        name for name in HARDWARE_THROTTLE_BITS.values()
        if _flag(_value(row, f"clocks_throttle_reasons.{name}", f"clocks_event_reasons.{name}"))
    )


def parse_query_csv(text: str) -> list[GpuReading]:
    """``nvidia-smi --query-gpu=... --format=csv[,nounits]``, read by its header row, whatever fields it holds.

    Headers carry units in brackets (``temperature.gpu``, ``memory.used [MiB]``); values may too
    (``52``, ``81559 MiB``). Lines that are not rows of the table (a lost GPU's message) are skipped:
    ``lost_gpus`` reads those.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    header_at = next((n for n, line in enumerate(lines) if "," in line and not _is_message(line)), None)
    if header_at is None:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines[header_at:])), skipinitialspace=True)
    header = [name.split(" [", 1)[0].strip() for name in next(reader)]
    readings: list[GpuReading] = []
    for cells in reader:
        if len(cells) != len(header):
            continue  # a message line amid the rows, never a row
        row = dict(zip(header, (cell.strip() for cell in cells), strict=True))
        index_text = _value(row, "index")
        bus_text = _value(row, "pci.bus_id")
        ecc = _number(_value(row, "ecc.errors.uncorrected.volatile.total"))
        readings.append(GpuReading(
            index=int(index_text) if index_text is not None and index_text.isdigit() else None,
            bus_id=normalise_bus_id(bus_text) if bus_text is not None and _BUS_IN_TEXT.fullmatch(bus_text) else None,
            name=_value(row, "name"),
            temperature_c=_number(_value(row, "temperature.gpu")),
            uncorrected_volatile_ecc=int(ecc) if ecc is not None else None,
            remap_pending=_flag(_value(row, "remapped_rows.pending")),
            remap_failure=_flag(_value(row, "remapped_rows.failure")),
            hardware_throttle=_hardware_throttle(row),
        ))
    return readings


def _is_message(line: str) -> bool:
    lowered = line.lower()
    return any(marker in lowered for marker in _LOST_MARKERS) or lowered.startswith(("unable to", "error", "failed"))


def lost_gpus(text: str) -> list[str]:
    """One label per line saying a GPU is lost or fell off the bus: its bus id where the line names one."""
    found: list[str] = []
    for line in text.splitlines():
        if not any(marker in line.lower() for marker in _LOST_MARKERS):
            continue
        bus = _BUS_IN_TEXT.search(line)
        label = normalise_bus_id(bus.group("bus")) if bus else "a GPU"
        if label not in found:
            found.append(label)
    return found


# -- the kernel log ----------------------------------------------------------------


def xid_events(lines: Iterable[str]) -> list[XidEvent]:
    """The driver's ``NVRM: Xid (PCI:<bus>): <xid>, ...`` lines among kernel-log messages."""
    events: list[XidEvent] = []
    for line in lines:
        match = _XID_LINE.search(line)
        if match:
            events.append(XidEvent(int(match.group("xid")), normalise_bus_id(match.group("bus")), line.strip()))
    return events


# -- the verdict ------------------------------------------------------------------


def _device_findings(facts: Facts) -> list[Finding]:
    findings = [Finding(DRAIN, f"{path} missing (gres.conf names it)", failed_gpu=path) for path in facts.missing_devices]
    if facts.gres_conf_error is not None:
        findings.append(Finding(WARN, facts.gres_conf_error))
    return findings


def _nvidia_smi_findings(facts: Facts, readings: Sequence[GpuReading]) -> list[Finding]:
    smi = facts.nvidia_smi
    if smi.missing:
        return []  # no driver tools on this node (an emulated one): the device files are all there is to check
    if smi.timed_out:
        return [Finding(DRAIN, "nvidia-smi hung (no answer within its timeout)")]
    findings = [
        Finding(DRAIN, f"{label} is lost (fallen off the bus)", failed_gpu=label if _BUS_IN_TEXT.fullmatch(label) else None)
        for label in lost_gpus(smi.stdout + "\n" + smi.stderr)
    ]
    if findings:
        return findings
    if smi.returncode != 0:
        detail = (smi.stderr.strip() or smi.stdout.strip()).splitlines()
        return [Finding(DRAIN, f"nvidia-smi failed (exit {smi.returncode}{': ' + detail[0][:80] if detail else ''})")]
    promised = len(facts.promised_devices)
    if len(readings) < promised:
        findings.append(Finding(DRAIN, f"nvidia-smi sees {len(readings)} GPU(s), gres.conf promises {promised}"))
    return findings


def _reading_findings(
    reading: GpuReading, thresholds: Thresholds, streaks: dict[str, int], previous: Mapping[str, int]
) -> list[Finding]:
    label = reading.label
    findings: list[Finding] = []
    if reading.uncorrected_volatile_ecc:
        findings.append(Finding(
            DRAIN, f"{reading.uncorrected_volatile_ecc} uncorrectable ECC error(s) on {label}", failed_gpu=reading.bus_id
        ))
    if reading.remap_failure:
        findings.append(Finding(DRAIN, f"row remapping failed on {label}", failed_gpu=reading.bus_id))
    if reading.remap_pending:
        findings.append(Finding(DRAIN, f"row remapping pending on {label} (reset the GPU)"))
    temperature = reading.temperature_c
    if temperature is not None and temperature >= thresholds.temperature_drain_c:
        findings.append(Finding(DRAIN, f"{label} at {temperature:g} C (drain at {thresholds.temperature_drain_c:g})"))
    elif temperature is not None and temperature >= thresholds.temperature_warn_c:
        findings.append(Finding(WARN, f"{label} at {temperature:g} C (warn at {thresholds.temperature_warn_c:g})"))
    if reading.hardware_throttle:
        streak = previous.get(label, 0) + 1
        streaks[label] = streak
        reasons = ",".join(reading.hardware_throttle)
        action = DRAIN if streak >= thresholds.throttle_drain_after_checks else WARN
        findings.append(Finding(action, f"{label} throttling ({reasons}) on {streak} check(s) in a row"))
    return findings


def _xid_findings(events: Sequence[XidEvent]) -> list[Finding]:
    findings: list[Finding] = []
    seen: set[tuple[int, str]] = set()
    for event in events:
        if (event.xid, event.bus_id) in seen:
            continue
        seen.add((event.xid, event.bus_id))
        rule = XID_RULES.get(event.xid, UNKNOWN_XID)
        failed = event.bus_id if rule.action == DRAIN else None
        findings.append(Finding(rule.action, f"Xid {event.xid} on {event.bus_id}", failed_gpu=failed, xid=event.xid))
    return findings


def judge(facts: Facts, thresholds: Thresholds, previous_streaks: Mapping[str, int] | None = None) -> Verdict:
    """Every finding, draining ones first (the drain reason names the first), then warnings."""
    previous = previous_streaks or {}
    readings = parse_query_csv(facts.nvidia_smi.stdout) if not facts.nvidia_smi.timed_out else []
    streaks: dict[str, int] = {}
    findings = _device_findings(facts) + _xid_findings(facts.xid_events) + _nvidia_smi_findings(facts, readings)
    for reading in readings:
        findings.extend(_reading_findings(reading, thresholds, streaks, previous))
    ordered = [f for f in findings if f.action == DRAIN] + [f for f in findings if f.action == WARN]
    return Verdict(tuple(ordered), streaks)
