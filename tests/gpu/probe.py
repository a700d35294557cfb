"""What a job on a real GPU node reports about the GPUs it can reach, and how it is read.

The job runs PROBE_SCRIPT (fixed text, no tenant input) with the node's device
files as arguments. It prints, one fact a line:
  cuda=<CUDA_VISIBLE_DEVICES, or "unset">
  smi-rc=<nvidia-smi -L's exit status>
  smi: <each line nvidia-smi -L printed, stderr included>
  open /dev/nvidiaN ok | open /dev/nvidiaN denied: <dd's error>
Pure: unit-tested in tests/unit/test_gpu_tier.py, run for real by tests/gpu.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# dd opens its input even to copy nothing: the open is what the device cgroup allows or refuses.
PROBE_SCRIPT = r"""
printf 'cuda=%s\n' "${CUDA_VISIBLE_DEVICES-unset}"
out=$(nvidia-smi -L 2>&1); rc=$?
printf 'smi-rc=%s\n' "$rc"
printf '%s\n' "$out" | sed 's/^/smi: /'
for dev in "$@"; do
  if err=$(dd if="$dev" of=/dev/null count=0 status=none 2>&1); then
    printf 'open %s ok\n' "$dev"
  else
    printf 'open %s denied: %s\n' "$dev" "$err"
  fi
done
"""

# "GPU 0: NVIDIA H200 (UUID: GPU-0a1b...)", as nvidia-smi -L lists a GPU (MIG devices are indented).
GPU_LINE = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")
OPEN_LINE = re.compile(r"^open (\S+) (ok|denied)(?:: (.*))?$")


@dataclass
class Probe:
    """One job's view of the GPUs."""

    cuda_visible_devices: str | None = None
    smi_returncode: int | None = None
    smi_output: list[str] = field(default_factory=list)
    opened: dict[str, bool] = field(default_factory=dict)
    open_errors: dict[str, str] = field(default_factory=dict)

    @property
    def gpu_uuids(self) -> list[str]:
        """The UUIDs of the GPUs nvidia-smi -L listed inside the job."""
        return listed_gpu_uuids("\n".join(self.smi_output))


def listed_gpu_uuids(text: str) -> list[str]:
    """UUIDs of the GPU lines of `nvidia-smi -L` output, in order; other lines are ignored."""
    return [match.group(3) for line in text.splitlines() if (match := GPU_LINE.match(line.strip()))]


def parse_probe(text: str) -> Probe:
    """Read PROBE_SCRIPT's output; a line it cannot have printed is refused (ValueError)."""
    probe = Probe()
    for line in text.splitlines():
        if line.startswith("cuda="):
            value = line.removeprefix("cuda=")
            probe.cuda_visible_devices = None if value == "unset" else value
        elif line.startswith("smi-rc="):
            probe.smi_returncode = int(line.removeprefix("smi-rc="))
        elif line.startswith("smi: ") or line == "smi:":
            probe.smi_output.append(line.removeprefix("smi:").removeprefix(" "))
        elif match := OPEN_LINE.match(line):
            device, verdict, error = match.groups()
            probe.opened[device] = verdict == "ok"
            if error is not None:
                probe.open_errors[device] = error
        elif line.strip():
            raise ValueError(f"unexpected line in the probe's output: {line!r}")
    if probe.smi_returncode is None:
        raise ValueError("the probe's output has no smi-rc= line: did the job run?")
    return probe
