"""The Ansible playbook leaves a healthy cluster, and rerunning it changes nothing.

Needs the cluster provisioned first (`make cluster`), as root.
"""

from __future__ import annotations

import pwd
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.ansible_run import PlaybookRun, run_playbook

pytestmark = pytest.mark.cluster


def run(argv: list[str], **kwargs: Any) -> str:
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kwargs)
    assert completed.returncode == 0, f"{argv} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed.stdout


def node_name() -> str:
    names = run(["sinfo", "--noheader", "--Node", "--format=%N"]).split()
    assert len(names) == 1, f"expected one node, sinfo lists {names}"
    return names[0]


def converge(repo_root: Path, **extra_env: str) -> PlaybookRun:
    """site.yml on the local inventory, as `make cluster` runs it."""
    return run_playbook(repo_root / "deploy" / "ansible", "local", "site.yml", **extra_env)


def test_rerun_changes_nothing(repo_root: Path) -> None:
    result = converge(repo_root)
    assert set(result.changed.values()) == {0}, f"a rerun changed something:\n{result.output}"


def test_playbook_takes_slurm_operator_rights_and_associations_from_the_service_user(repo_root: Path) -> None:
    # 'nobody' exists on every Debian/Ubuntu machine and never owns a Slurm user otherwise.
    user = "nobody"
    try:
        # As earlier releases left gpupool's service user (SUDO_USER here): a Slurm operator.
        run(["sacctmgr", "--immediate", "add", "user", user, "account=root", "adminlevel=Operator"])
        first = converge(repo_root, SUDO_USER=user)
        assert list(first.changed.values()) == [2]  # demoted, then its association removed
        level = run(["sacctmgr", "--noheader", "--parsable2", "show", "user", user, "format=user,adminlevel"])
        assert level.strip() in ("", f"{user}|None")
        associations = run(["sacctmgr", "--noheader", "--parsable2", "show", "association", "where", f"user={user}", "format=account"])
        assert associations.strip() == ""  # it can submit nothing of its own, under no account
        again = converge(repo_root, SUDO_USER=user)
        assert list(again.changed.values()) == [0]
    finally:
        subprocess.run(["sacctmgr", "--immediate", "delete", "user", user], capture_output=True, timeout=60, check=False)


def test_tenants_group_exists_for_the_accounts_users() -> None:
    # The run-as helper acts only as a member of this group (gpupool/slurm/tenants.py).
    assert run(["getent", "group", "gpupool-tenants"]).startswith("gpupool-tenants:")


def test_config_has_gpu_accounting_settings() -> None:
    config = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition("=") for line in run(["scontrol", "show", "config"]).splitlines())
    )
    # slurmctld lists its default TRES first; every GPU type of slurm.conf follows.
    assert set(config["AccountingStorageTRES"].split(",")) >= {"gres/gpu", "gres/gpu:rtx4090", "gres/gpu:rtx3090"}
    assert set(config["AccountingStorageEnforce"].split(",")) >= {"associations", "limits", "safe"}
    assert config["SelectType"] == "select/cons_tres"
    assert config["ClusterName"] == "gpupool"


def test_sinfo_shows_the_node_with_four_gpus_taking_jobs() -> None:
    line = run(["sinfo", "--noheader", "--Node", "--format=%N %P %t %G"]).strip()
    assert re.fullmatch(rf"{re.escape(node_name())} gpu\* (idle|mix|alloc) gpu:rtx4090:4", line), line


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


def test_munge_credentials_round_trip() -> None:
    credential = run(["munge", "--no-input"])
    decoded = run(["unmunge"], input=credential)
    assert re.search(r"^STATUS:\s+Success \(0\)$", decoded, re.MULTILINE), decoded


@pytest.mark.parametrize(
    ("path", "owner", "mode"),
    [
        # munged refuses a key others can read; the Slurm database password is in slurmdbd.conf.
        ("/etc/munge/munge.key", "munge", 0o400),
        ("/etc/slurm/slurmdbd.conf", "slurm", 0o600),
        ("/etc/slurm/.slurmdbd-db-password", "root", 0o600),
    ],
)
def test_secrets_are_private(path: str, owner: str, mode: int) -> None:
    info = Path(path).stat()
    assert pwd.getpwuid(info.st_uid).pw_name == owner
    assert stat.S_IMODE(info.st_mode) == mode, oct(stat.S_IMODE(info.st_mode))
