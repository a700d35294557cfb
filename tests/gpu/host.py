"""What this machine has: nvidia-smi's GPU list, read once when the tier is collected."""

from __future__ import annotations

from pathlib import Path

from gpupool.errors import CommandFailed, CommandTimedOut
from gpupool.proc import run_command

REPO_ROOT = Path(__file__).resolve().parents[2]
DISCOVER = REPO_ROOT / "deploy/ansible/roles/slurm_compute/files/slurm-gpu-discover"
NVIDIA_SMI_TIMEOUT_S = 30.0
NO_GPU_REASON = "no NVIDIA GPU/driver found (nvidia-smi -L lists no GPU): the real-GPU tier runs only on a GPU machine"


def listed_gpus() -> str:
    """`nvidia-smi -L`'s output, or "" when there is no nvidia-smi, driver or GPU."""
    try:
        return run_command(["nvidia-smi", "-L"], timeout_s=NVIDIA_SMI_TIMEOUT_S).stdout
    except (CommandFailed, CommandTimedOut):  # CommandNotFound is a CommandFailed
        return ""


HOST_GPU_LIST = listed_gpus()
