"""`gpupool top` against the real cluster: a real GPU job, real scontrol, a real HTTP scrape.

The node's GPUs are emulated, so its exporter's answer is the saved scrape in
tests/unit/fixtures/, given with --metrics-file or served over HTTP on the node
name (``vm``, this machine) by a small server in the test.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.support.tenancy import TENANT_PREFIX, sbatch_as_tenant
from gpupool.slurm.client import SlurmClient
from tests.conftest import REPO, base_settings, slurm_cmd, throwaway_slurm_account, wait_for
from tests.live.conftest import free_port
from tests.support.gpu_exporter import serve_metrics

GPUPOOL = str(Path(sys.executable).parent / "gpupool")
DCGM_SCRAPE = REPO / "tests" / "unit" / "fixtures" / "dcgm_exporter_vm.prom"
NODE = "vm"
# What that scrape says of each GPU's utilization.
UTILIZATION = {0: "97%", 1: "3%", 2: "0%", 3: "88%"}


def run_top(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **{f"GPUPOOL_{key.upper()}": value for key, value in settings.items()}}
    return subprocess.run([GPUPOOL, "top", *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def rows_of(view: str, job_id: int) -> dict[int, list[str]]:
    """The view's rows for one job, by GPU index."""
    return {int(line.split()[4]): line.split() for line in view.splitlines() if line.startswith(f"{job_id} ")}


@pytest.fixture(scope="module")
def gpu_job() -> Iterator[tuple[int, str, set[int]]]:
    """A running 2-GPU job of a new account: (Slurm job id, account, the GPU indices Slurm gave it)."""
    with throwaway_slurm_account(SlurmClient(base_settings()), "top") as account:
        job_id = sbatch_as_tenant(account, "--gres=gpu:2", "--job-name=top-live", wrap="sleep 600")

        def detail() -> str:
            text = slurm_cmd("scontrol", "--details", "show", "job", str(job_id))
            return text if "JobState=RUNNING" in text else ""

        # Read with a plain pattern here, not with the parser under test.
        found = re.search(r"GRES=gpu:\w+:2\(IDX:(\d+)[-,](\d+)\)", wait_for(detail, timeout_s=120, what=f"job {job_id} to run"))
        assert found, "scontrol printed no GPU indices for a 2-GPU job"
        indices = {int(found[1]), int(found[2])}
        yield job_id, account, indices


def test_top_shows_a_running_jobs_account_and_gpus(gpu_job: tuple[int, str, set[int]]) -> None:
    job_id, account, indices = gpu_job
    result = run_top("--once", "--metrics-file", f"{NODE}={DCGM_SCRAPE}")
    assert result.returncode == 0, result.stderr
    rows = rows_of(result.stdout, job_id)
    assert set(rows) == indices, result.stdout
    for index, row in rows.items():
        assert row[1:6] == [account, TENANT_PREFIX + account, NODE, str(index), UTILIZATION[index]]
    assert "\x1b" not in result.stdout  # --once is plain text


@pytest.fixture
def exporter() -> Iterator[int]:
    """An HTTP server answering /metrics with the saved scrape, as a node's exporter would."""
    body = DCGM_SCRAPE.read_bytes()

    with serve_metrics(lambda: body) as port:
        yield port


def test_top_scrapes_the_nodes_exporter_and_survives_a_dead_one(
    gpu_job: tuple[int, str, set[int]], exporter: int
) -> None:
    job_id, account, indices = gpu_job
    scraped = run_top("--once", gpu_exporter_port=str(exporter))
    assert scraped.returncode == 0, scraped.stderr
    rows = rows_of(scraped.stdout, job_id)
    assert {index: row[5] for index, row in rows.items()} == {index: UTILIZATION[index] for index in indices}

    dead_port = free_port()  # bound and released: nothing listens there
    dead = run_top("--once", gpu_exporter_port=str(dead_port), gpu_exporter_timeout_s="2")
    assert dead.returncode == 0, dead.stderr
    rows = rows_of(dead.stdout, job_id)
    assert set(rows) == indices
    assert all(row[1] == account and row[5:] == ["n/a", "n/a", "n/a", "n/a"] for row in rows.values())
    assert f"{NODE}: GPU metrics n/a: http://{NODE}:{dead_port}/metrics: " in dead.stdout

