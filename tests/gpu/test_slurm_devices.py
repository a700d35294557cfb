"""A one-node Slurm on the real GPUs (inventories/local-gpu): ConstrainDevices gives a job its GPU and no other.

make test-gpu provisions the local cluster from inventories/local-gpu first:
discovery's lines in gres.conf, task/cgroup with ConstrainDevices=yes. Jobs run
as root (the operator: root's association, job_submit.lua leaves it alone); a
device cgroup confines root as much as anyone. Each job runs probe.PROBE_SCRIPT
with every discovered device file and says which it could open.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupool.proc import run_command
from tests.gpu.probe import PROBE_SCRIPT, Probe, parse_probe

pytestmark = pytest.mark.gpu

GRES_CONF = Path("/etc/slurm/gres.conf")
JOB_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def gpu_node(discovery: dict[str, Any], node_name: str) -> str:
    """The local node, provisioned with the discovered GPUs and in service; else a message saying what to run."""
    gres_conf = GRES_CONF.read_text(encoding="utf-8") if GRES_CONF.exists() else ""
    missing = [line for line in discovery["gres_conf"] if line not in gres_conf.splitlines()]
    assert not missing, (
        f"{GRES_CONF} lacks the discovered GPUs {missing}: run `make test-gpu`, which provisions the local "
        f"cluster from deploy/ansible/inventories/local-gpu first"
    )
    node = run_command(["scontrol", "--oneliner", "show", "node", node_name], timeout_s=30.0).stdout
    print(node)
    state = next(word for word in node.split() if word.startswith("State="))
    assert not any(flag in state for flag in ("DRAIN", "DOWN", "FAIL")), f"{node_name} is out of service: {node}"
    assert f"gpu:{discovery['gpus'][0]['type']}" in node
    return node_name


def run_probe(node: str, files: list[str], *gres: str) -> Probe:
    argv = ["srun", f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--time=2", *gres,
            "/bin/sh", "-c", PROBE_SCRIPT, "probe", *files]
    result = run_command(argv, timeout_s=JOB_TIMEOUT_S)
    print(f"$ srun {' '.join(gres) or '(no --gres)'} ...\n{result.stdout}{result.stderr}")
    return parse_probe(result.stdout)


def test_a_job_with_one_gpu_sees_exactly_that_gpu(
    gpu_node: str, discovery: dict[str, Any], host_gpus: dict[str, str]
) -> None:
    files = [gpu["file"] for gpu in discovery["gpus"]]
    probe = run_probe(gpu_node, files, "--gres=gpu:1")

    assert probe.smi_returncode == 0, probe.smi_output
    assert len(probe.gpu_uuids) == 1, probe.smi_output
    assert probe.cuda_visible_devices not in (None, ""), "CUDA_VISIBLE_DEVICES is not set in a --gres=gpu:1 job"
    assert "," not in (probe.cuda_visible_devices or "")
    opened = [device for device in files if probe.opened[device]]
    assert len(opened) == 1, probe.opened
    # The GPU nvidia-smi shows inside the job is the one behind the device file the job may open.
    bus_id = next(gpu["pci_bus_id"] for gpu in discovery["gpus"] if gpu["file"] == opened[0])
    assert probe.gpu_uuids == [host_gpus[bus_id]]
    for device in set(files) - set(opened):
        assert "Operation not permitted" in probe.open_errors[device]


def test_a_job_without_gres_sees_no_gpu(gpu_node: str, discovery: dict[str, Any]) -> None:
    files = [gpu["file"] for gpu in discovery["gpus"]]
    probe = run_probe(gpu_node, files)

    assert probe.gpu_uuids == [], probe.smi_output
    assert probe.opened == dict.fromkeys(files, False)
    for device in files:
        assert "Operation not permitted" in probe.open_errors[device]
