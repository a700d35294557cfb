"""The multinode cluster's slurmctld holds tenants' own jobs to the same bounds as the local one.

Its job_submit.lua is rendered from its own nodes: mn-gpu1 (8 CPUs, 4 rtx4090)
and mn-gpu2 (8 CPUs, 2 rtx3090) give an rtx3090 twice the CPUs of an rtx4090.
"""

from __future__ import annotations

import pwd

import pytest

from gpupool.config import Settings
from gpupool.proc import CommandResult, RunAs, run_command
from tests.multinode.conftest import mn_cmd, mn_env

pytestmark = [pytest.mark.multinode, pytest.mark.slow]


def as_tenant(account: str, command: str, *options: str) -> CommandResult:
    tenant = pwd.getpwnam(f"gp-{account}")
    argv = [command, f"--account={account}", *options]
    argv += ["--parsable", "--output=/dev/null", "--wrap=true"] if command == "sbatch" else ["true"]
    return run_command(
        argv, timeout_s=30, env=mn_env(), run_as=RunAs(tenant.pw_uid, tenant.pw_gid), cwd="/", check=False
    )


@pytest.mark.parametrize("command", ["sbatch", "srun", "salloc"])
def test_free_unbounded_and_whole_node_jobs_are_refused(account: str, command: str) -> None:
    for options, message in (
        (["--gres=gpu:0", "--mem=0", "--cpus-per-task=8", "--time=UNLIMITED"], "every job needs at least one GPU"),
        (["--gres=gpu:1", f"--time={Settings.max_time_limit_min + 1}"], "the time limit may be at most"),
        (["--gres=gpu:1", "--mem=0"], "--mem=0 (all of a node's memory) is not offered"),
    ):
        refused = as_tenant(account, command, *options)
        assert refused.returncode != 0
        assert f"{command}: error: gpupool: {message}" in refused.stderr, refused.stderr
    assert mn_cmd("squeue", "-h", f"--account={account}", "-o", "%i").strip() == ""


def test_the_cpu_cap_is_each_gpu_types_own_share(account: str) -> None:
    try:
        # mn-gpu2: 8 CPUs for 2 rtx3090, so 4 per GPU; mn-gpu1: 8 for 4 rtx4090, 2 per GPU.
        accepted = as_tenant(account, "sbatch", "--gres=gpu:rtx3090:1", "--cpus-per-task=4", "--mem=4G", "--hold")
        assert accepted.returncode == 0, accepted.stderr
        refused = as_tenant(account, "sbatch", "--gres=gpu:rtx4090:1", "--cpus-per-task=4", "--mem=4G", "--hold")
        assert "gpupool: 4 CPU(s) for 1 GPU(s) is above the cap: at most 2 per GPU" in refused.stderr
    finally:
        mn_cmd("scancel", f"--account={account}", check=False)
