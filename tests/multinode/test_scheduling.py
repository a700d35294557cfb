"""Where jobs go on a cluster of two different GPU nodes, by Slurm's own answers."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from gpupool.errors import CommandFailed
from gpupool.proc import RunAs, run_command
from tests.conftest import wait_for, wait_for_state
from tests.multinode.conftest import GPU2_NODE, GPU4_NODE, mn_cmd, mn_env, sacct_runs

pytestmark = [pytest.mark.multinode, pytest.mark.slow]

# A train-like job over two nodes: one task per node, as torchrun --nnodes=2 (or an NCCL
# job started with srun) would run; rank 0's node is the rendezvous host. Each task
# prints what NCCL and torch.distributed read.
TWO_NODE_SCRIPT = """#!/bin/bash
set -euo pipefail
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR MASTER_PORT=29500
srun --ntasks-per-node=1 bash -c 'echo "host=$(hostname) rank=$SLURM_PROCID world=$SLURM_NTASKS \
nnodes=$SLURM_NNODES nodelist=$SLURM_JOB_NODELIST master=$MASTER_ADDR:$MASTER_PORT \
gpus_on_node=$SLURM_GPUS_ON_NODE"'
sleep 5  # time to look at the allocation
"""


def submit(client: FlaskClient, headers: dict[str, str], **body: object) -> dict:
    response = client.post("/submit", headers=headers, json=body)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def test_gpu_type_routes_each_job_to_the_node_with_that_card(client: FlaskClient, auth: dict[str, str]) -> None:
    jobs = {
        gpu_type: submit(client, auth, template="hello", gpus=2, gpu_type=gpu_type, params={"seconds": 1})
        for gpu_type in ("rtx4090", "rtx3090")
    }
    for gpu_type, node in (("rtx4090", GPU4_NODE), ("rtx3090", GPU2_NODE)):
        done = wait_for_state(client, jobs[gpu_type]["job_id"], auth, {"COMPLETED", "FAILED"}, timeout_s=120)
        assert done["state"] == "COMPLETED" and done["node"] == node
        (run,) = sacct_runs(jobs[gpu_type]["slurm_job_id"])
        assert run["NodeList"] == node
        assert f"gres/gpu:{gpu_type}=2" in run["AllocTRES"].split(",")


def test_six_gpus_are_refused_at_submit_because_no_node_has_six(client: FlaskClient, auth: dict[str, str], account: str) -> None:
    response = client.post("/submit", headers=auth, json={"template": "hello", "gpus": 6})
    assert response.status_code == 422
    assert response.get_json()["message"] == "asked for 6 GPU(s) but the largest node has 4"
    # Slurm itself agrees: six GPUs on one node fit nowhere, four and two on two nodes do not make six.
    tenant = pwd.getpwnam(f"gp-{account}")
    with pytest.raises(CommandFailed) as refused:
        run_command(
            ["sbatch", "--parsable", f"--account={account}", "--partition=gpu", "--nodes=1", "--gres=gpu:6",
             "--output=/dev/null", "--wrap=true"],
            timeout_s=30, env=mn_env(), run_as=RunAs(tenant.pw_uid, tenant.pw_gid), cwd="/",
        )
    assert "Requested node configuration is not available" in refused.value.stderr


def test_a_two_node_job_gets_gpus_on_both_nodes_and_the_rendezvous_variables(
    account: str, tenant_job_dir: Path
) -> None:
    """Submitted with sbatch as the tenant: gpupool's templates are single-node (--nodes=1)."""
    tenant = pwd.getpwnam(f"gp-{account}")
    output = tenant_job_dir / "two-node.out"
    submitted = run_command(
        ["sbatch", "--parsable", f"--account={account}", "--partition=gpu", "--nodes=2", "--ntasks-per-node=1",
         "--gres=gpu:2", "--time=5", f"--output={output}"],
        input_text=TWO_NODE_SCRIPT, timeout_s=30, env=mn_env(), run_as=RunAs(tenant.pw_uid, tenant.pw_gid),
        cwd=str(tenant_job_dir),
    )
    job_id = int(submitted.stdout.strip().split(";")[0])

    # Slurm's allocation while it runs: two GPUs on each node, of each node's own type.
    def allocation() -> str | None:
        text = mn_cmd("scontrol", "--details", "--oneliner", "show", "job", str(job_id), check=False)
        return text if "JobState=RUNNING" in text else None

    detail = wait_for(allocation, timeout_s=120, what=f"two-node job {job_id} to start")
    assert f"Nodes={GPU4_NODE} " in detail and f"Nodes={GPU2_NODE} " in detail
    assert "GRES=gpu:rtx4090:2(IDX:0-1)" in detail and "GRES=gpu:rtx3090:2(IDX:0-1)" in detail

    # slurmdbd may hold the end of the job before the rest of its record.
    def finished() -> dict[str, str] | None:
        runs = sacct_runs(job_id)
        done = runs and runs[-1]["State"] not in ("PENDING", "RUNNING") and runs[-1]["End"] != "Unknown"
        return runs[-1] if done and runs[-1]["NodeList"] == "mn-gpu[1-2]" else None

    run = wait_for(finished, timeout_s=120, what=f"two-node job {job_id} to finish on both nodes in sacct")
    assert run["State"] == "COMPLETED", output.read_text() if output.exists() else run
    assert {"gres/gpu=4", "gres/gpu:rtx4090=2", "gres/gpu:rtx3090=2"} <= set(run["AllocTRES"].split(","))

    tasks = {}
    for line in output.read_text().splitlines():
        values = dict(word.split("=", 1) for word in line.split())
        tasks[values["host"]] = values
    assert sorted(tasks) == [GPU4_NODE, GPU2_NODE]
    assert {tasks[GPU4_NODE]["rank"], tasks[GPU2_NODE]["rank"]} == {"0", "1"}
    for values in tasks.values():
        assert values["world"] == "2" and values["nnodes"] == "2"
        assert values["nodelist"] == "mn-gpu[1-2]"
        assert values["master"] == f"{GPU4_NODE}:29500"
        assert values["gpus_on_node"] == "2"
