"""The Ansible playbook leaves a healthy cluster, and rerunning it changes nothing.

Needs the cluster provisioned first (`make cluster`), as root.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cluster

RECAP_LINE = re.compile(
    r"^(?P<host>\S+)\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


def run(argv: list[str], **kwargs: Any) -> str:
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kwargs)
    assert completed.returncode == 0, f"{argv} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed.stdout


def node_name() -> str:
    names = run(["sinfo", "--noheader", "--Node", "--format=%N"]).split()
    assert len(names) == 1, f"expected one node, sinfo lists {names}"
    return names[0]


def run_playbook(repo_root: Path, **extra_env: str) -> tuple[str, list[re.Match[str]]]:
    """Run site.yml on the local inventory; its output and PLAY RECAP lines."""
    ansible_dir = repo_root / "deploy" / "ansible"
    # The virtualenv running pytest is the one holding ansible-core.
    ansible_playbook = Path(sys.prefix) / "bin" / "ansible-playbook"
    env = {key: value for key, value in os.environ.items() if key != "SUDO_USER"}
    env.update({"ANSIBLE_CONFIG": str(ansible_dir / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", **extra_env})
    completed = subprocess.run(
        [str(ansible_playbook), "-i", str(ansible_dir / "inventories" / "local"), str(ansible_dir / "site.yml")],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = completed.stdout + completed.stderr
    recap = output[output.rfind("PLAY RECAP") :]
    hosts = list(RECAP_LINE.finditer(recap))
    assert completed.returncode == 0, output
    assert hosts, f"no PLAY RECAP in:\n{output}"
    for host in hosts:
        assert host["failed"] == "0" and host["unreachable"] == "0", recap
    return output, hosts


def test_rerun_changes_nothing(repo_root: Path) -> None:
    output, hosts = run_playbook(repo_root)
    for host in hosts:
        assert host["changed"] == "0", f"a rerun changed something:\n{output}"


def test_sudo_user_becomes_the_slurm_operator_gpupool_runs_as(repo_root: Path) -> None:
    # 'nobody' exists on every Debian/Ubuntu machine and never owns a Slurm user otherwise.
    user = "nobody"
    try:
        _, first = run_playbook(repo_root, SUDO_USER=user)
        assert [host["changed"] for host in first] == ["1"]
        level = run(["sacctmgr", "--noheader", "--parsable2", "show", "user", user, "format=user,adminlevel"])
        assert level.strip() == f"{user}|Operator"
        _, again = run_playbook(repo_root, SUDO_USER=user)
        assert [host["changed"] for host in again] == ["0"]
    finally:
        subprocess.run(["sacctmgr", "--immediate", "delete", "user", user], capture_output=True, timeout=60, check=False)


def test_config_has_gpu_accounting_settings() -> None:
    config = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition("=") for line in run(["scontrol", "show", "config"]).splitlines())
    )
    assert "gres/gpu:rtx4090" in config["AccountingStorageTRES"].split(",")
    assert "gres/gpu" in config["AccountingStorageTRES"].split(",")
    assert set(config["AccountingStorageEnforce"].split(",")) >= {"associations", "limits", "safe"}
    assert config["SelectType"] == "select/cons_tres"
    assert config["ClusterName"] == "gpupool"


def test_node_has_four_gpus_and_takes_jobs() -> None:
    node = run(["scontrol", "--oneliner", "show", "node", node_name()])
    assert re.search(r"\bGres=gpu:rtx4090:4\b", node), node
    state = re.search(r"\bState=(\S+)", node)
    assert state, node
    assert re.match(r"(IDLE|MIXED|ALLOCATED)\b", state[1]), node
    assert not re.search(r"DRAIN|DOWN|INVALID|NOT_RESPONDING", state[1]), node


def test_cluster_is_registered_with_slurmdbd() -> None:
    clusters = run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"]).split()
    assert "gpupool" in clusters
