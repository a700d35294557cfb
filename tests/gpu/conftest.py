"""The real-GPU tier (make test-gpu): fixtures shared by its modules.

Run by hand, as root, on a machine with an NVIDIA GPU and its driver, after
`make test-gpu` reprovisioned the local cluster from inventories/local-gpu.
Everywhere else every test here skips, with the reason below; `make test`
never collects this folder (pyproject's testpaths and the Makefile's tiers
leave it out).
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from gpupool.proc import run_command
from tests.gpu.host import DISCOVER, HOST_GPU_LIST, NO_GPU_REASON
from tests.gpu.probe import listed_gpu_uuids


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here (each module marks itself gpu) skips where nvidia-smi lists no GPU."""
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            if not listed_gpu_uuids(HOST_GPU_LIST):
                item.add_marker(pytest.mark.skip(reason=NO_GPU_REASON))


@pytest.fixture(scope="session")
def node_name() -> str:
    """The Slurm node name the local inventory gives this machine (its short host name)."""
    return socket.gethostname().split(".")[0]


@pytest.fixture(scope="session")
def host_gpus() -> dict[str, str]:
    """PCI bus id -> UUID of every GPU, as nvidia-smi sees them outside any job."""
    query = run_command(
        ["nvidia-smi", "--query-gpu=pci.bus_id,uuid", "--format=csv,noheader"], timeout_s=30.0
    ).stdout
    pairs = [tuple(cell.strip() for cell in line.split(",")) for line in query.splitlines() if line.strip()]
    return {bus_id: uuid for bus_id, uuid in pairs}


@pytest.fixture(scope="session")
def discovery(node_name: str) -> dict[str, Any]:
    """slurm-gpu-discover --json on this machine, run as the playbook runs it (the system python3)."""
    python3 = shutil.which("python3", path="/usr/bin:/bin") or "python3"
    result = run_command([python3, str(DISCOVER), "--json", "--node-name", node_name], timeout_s=120.0, check=False)
    print(f"slurm-gpu-discover (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document
