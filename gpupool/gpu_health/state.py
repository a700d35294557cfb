"""What one check leaves for the next: the kernel-log cursor, throttle streaks, the last verdict; and the run lock.

Slurm starts the check every HealthCheckInterval and at slurmd's start; a slow
run (nvidia-smi near its timeout) can still be going when the next begins. The
lock (flock on a file beside the state) makes the later run step aside, so two
runs never read the same kernel records twice or write the state at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

STATE_FILE = "state.json"
LOCK_FILE = "lock"


@dataclass
class CheckState:
    boot_id: str = ""
    # The last kernel record read (/dev/kmsg sequence numbers restart at each boot).
    kernel_sequence: int = -1
    throttle_streaks: dict[str, int] = field(default_factory=dict)
    last_findings: list[dict[str, str]] = field(default_factory=list)
    # Each GPU's Slurm index by its bus id, as the last nvidia-smi answer showed: a GPU that
    # has since fallen off the bus is no longer in the answer (gpupool.gpu_health.jobs).
    gpu_indices: dict[str, int] = field(default_factory=dict)


def load_state(state_dir: str) -> CheckState:
    """The saved state, or a fresh one when there is none or it cannot be read (the kernel log is then read from boot)."""
    try:
        with open(os.path.join(state_dir, STATE_FILE), encoding="utf-8") as handle:
            raw: Any = json.load(handle)
    except (OSError, ValueError):
        return CheckState()
    if not isinstance(raw, dict):
        return CheckState()
    streaks = raw.get("throttle_streaks")
    return CheckState(
        boot_id=str(raw.get("boot_id", "")),
        kernel_sequence=int(raw.get("kernel_sequence", -1)),
        throttle_streaks={str(k): int(v) for k, v in streaks.items()} if isinstance(streaks, dict) else {},
        last_findings=[],
        gpu_indices={str(k): int(v) for k, v in indices.items()} if isinstance(indices := raw.get("gpu_indices"), dict) else {},
    )


def save_state(state_dir: str, state: CheckState) -> None:
    """Written whole and renamed into place: a run killed mid-write leaves the previous state."""
    path = os.path.join(state_dir, STATE_FILE)
    temporary = f"{path}.{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(state.__dict__, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(temporary, path)


@contextlib.contextmanager
def exclusive_run(state_dir: str) -> Iterator[bool]:
    """True while this run holds the lock; False (at once, no waiting) when another run holds it."""
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    fd = os.open(os.path.join(state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock
