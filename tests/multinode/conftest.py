"""The multinode CI cluster (`make cluster-multinode`): a second Slurm cluster on this machine.

Its hosts are namespaces (deploy/multinode/netns.sh): controller mn-ctl, and
compute nodes mn-gpu1 (4 rtx4090) and mn-gpu2 (2 rtx3090). Every Slurm command
here reads the API host's slurm.conf (MULTINODE_SLURM_CONF), through
SLURM_CONF: the API's through a folder of wrappers given as slurm_bin_dir, the
run-as helper's and the billing pass's through their environment. The local
one-node cluster keeps running beside it, untouched.

These tests run with `make test-multinode` (pytest -m multinode); a plain
`pytest` skips them, since they rerun the multinode playbook and stop nodes.
"""

from __future__ import annotations

import os
import pwd
import secrets
import stat
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from sqlalchemy.orm import sessionmaker

from bench.support.services import TENANT_PREFIX, throwaway_slurm_account
from bench.support.services import cancel_account_jobs as cancel_jobs_of
from bench.support.tenancy import runas_helper
from gpupool.config import Settings
from gpupool.models import Account
from gpupool.proc import run_command
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import parse_delimited
from tests.cluster.ansible_run import PlaybookRun, run_playbook
from tests.conftest import REPO, base_settings

ANSIBLE_DIR = REPO / "deploy" / "ansible"
MULTINODE_SLURM_CONF = "/etc/gpupool-multinode/mn-ctl/slurm/slurm.conf"
CLUSTER_NAME = "gpupool_mn"
GPU4_NODE, GPU2_NODE = "mn-gpu1", "mn-gpu2"
# The Slurm commands gpupool runs, each wrapped to read the multinode cluster's config.
SLURM_COMMANDS = ("sbatch", "scancel", "squeue", "sacct", "sacctmgr", "scontrol", "sinfo", "sreport")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "multinode: needs the multinode CI cluster (make test-multinode)")


@pytest.fixture(scope="session", autouse=True)
def _only_when_asked(request: pytest.FixtureRequest) -> None:
    if "multinode" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the multinode suite runs with `make test-multinode` (pytest -m multinode)")


def mn_env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "TZ": "UTC", "LANG": "C.UTF-8", "SLURM_CONF": MULTINODE_SLURM_CONF}


def mn_cmd(*argv: str, check: bool = True) -> str:
    """A Slurm command against the multinode cluster, as root on this machine."""
    return run_command(list(argv), timeout_s=60, env=mn_env(), check=check).stdout


def sacct_runs(slurm_job_id: int, fields: str = "JobIDRaw,State,NodeList,AllocTRES,ElapsedRaw,End") -> list[dict[str, str]]:
    """Every run (-D) of one job, as the multinode cluster's accounting recorded it."""
    return parse_delimited(mn_cmd("sacct", "-X", "-D", "-P", "-j", str(slurm_job_id), "-o", fields))


def node_line(node: str) -> str:
    return mn_cmd("scontrol", "--oneliner", "show", "node", node)


def node_state(node: str) -> str:
    """sinfo's long state word for one node: idle, mixed, allocated, drained, down*..."""
    return mn_cmd("sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T").strip()


def namespace_pids(node: str) -> list[int]:
    return [int(pid) for pid in run_command(["ip", "netns", "pids", node], timeout_s=30).stdout.split()]


def run_multinode_playbook(*args: str) -> PlaybookRun:
    return run_playbook(ANSIBLE_DIR, "multinode", "site.yml", *args)


@pytest.fixture(scope="session")
def multinode_up() -> None:
    """Fails, rather than skips, when `make cluster-multinode` has not run: this suite was asked for."""
    assert "is UP" in mn_cmd("scontrol", "ping", check=False), "no multinode slurmctld: run `make cluster-multinode`"


@pytest.fixture(scope="session")
def slurm_wrappers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """slurm_bin_dir for the API: each command exported SLURM_CONF, then the real one."""
    folder = tmp_path_factory.mktemp("multinode-bin")
    for command in SLURM_COMMANDS:
        wrapper = folder / command
        wrapper.write_text(f'#!/bin/sh\nSLURM_CONF={MULTINODE_SLURM_CONF} exec /usr/bin/{command} "$@"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


@pytest.fixture(scope="session")
def runas_socket(job_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The run-as helper, submitting to the multinode cluster as each tenant."""
    with runas_helper(job_root, tmp_path_factory.mktemp("runas"), extra_env={"SLURM_CONF": MULTINODE_SLURM_CONF}) as socket_path:
        yield socket_path


@pytest.fixture(scope="session")
def session_settings(pg_url: str, job_root: Path, runas_socket: str, slurm_wrappers: Path, multinode_up: None) -> Settings:
    return base_settings(database_url=pg_url, job_root=str(job_root), runas_socket=runas_socket, slurm_bin_dir=str(slurm_wrappers))


def cancel_account_jobs(account: str) -> None:
    cancel_jobs_of(account, run=mn_cmd, timeout_s=90)


def multinode_account(slurm: SlurmClient, prefix: str, gpu_limit: int = 8) -> AbstractContextManager[str]:
    """A Slurm account of the multinode cluster with its own tenant user (on every host: they share /etc/passwd)."""
    return throwaway_slurm_account(slurm, prefix, gpu_limit, run=mn_cmd, drain_timeout_s=90)


@pytest.fixture(scope="session")
def slurm_account(slurm: SlurmClient) -> Iterator[str]:
    with multinode_account(slurm, "mn") as name:
        yield name


@pytest.fixture
def account(session_factory: sessionmaker, slurm_account: str) -> Iterator[str]:
    """The account's database row, allowed more GPUs than any node has (the limit is not what is tested)."""
    user = TENANT_PREFIX + slurm_account
    with session_factory() as session, session.begin():
        session.add(Account(name=slurm_account, gpu_limit=8, unix_user=user, unix_uid=pwd.getpwnam(user).pw_uid))
    yield slurm_account
    cancel_account_jobs(slurm_account)


@pytest.fixture(scope="session")
def tenant_job_dir(job_root: Path) -> Iterator[Path]:
    """A folder of the job root the tests' raw sbatch jobs may write to (every host sees it)."""
    folder = job_root / f"raw-{secrets.token_hex(3)}"
    folder.mkdir(mode=0o1777)
    os.chmod(folder, 0o1777)
    yield folder
