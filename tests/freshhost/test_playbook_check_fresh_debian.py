"""`ansible-playbook site.yml --check --diff`, README step 4's first command, works on a fresh host and changes nothing there.

The host (deploy/freshhost) is a fresh minimal Debian 12 with systemd as PID 1,
and is the whole cluster: controller, API host and compute node (emulated
GPUs). Ansible reaches it through tests/freshhost/connection_plugins/freshhost.py
(host.sh exec). The playbook's modules need python3 and python3-apt, which the
real run's bootstrap installs; a check run may not install anything, so the test
installs them first, as an operator's image would have them. Then the check
run must end with failed=0, and the host must still have none of what a real
run would install or write.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cluster.ansible_run import RECAP_LINE, ansible_env, venv_tool
from tests.freshhost.conftest import HOST_SH, REPO, FreshHost

pytestmark = [pytest.mark.freshhost]

ANSIBLE_DIR = REPO / "deploy" / "ansible"
CONNECTION_PLUGINS = Path(__file__).resolve().parent / "connection_plugins"


def one_host_inventory(folder: Path, host: FreshHost) -> Path:
    """The example site's settings, on one host in every group, with emulated GPUs."""
    inventory = folder / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "freshhost", "ansible_host": host.name,
                 "ansible_freshhost_host_sh": str(HOST_SH), "ansible_python_interpreter": "/usr/bin/python3"},
        "children": {group: {"hosts": {"fresh1": None}} for group in ("controller", "api", "compute")},
    }}))
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump({
        "slurm_cluster_name": "gpupool",
        "gpu_mode": "emulated",
        "gpu_emulated_device_dir": "/var/lib/gpupool/emulated-gpus",
        "gpupool_service_user": "gpupool",
        "common_service_user_uid": 990,
        "common_service_user_gid": 990,
        # The container's clock and kernel settings are this machine's.
        "common_time_sync": False,
        "common_sysctls": {},
        # Its systemd mounts no cpuacct hierarchy (it asks for cpu and cpuacct together, this machine's
        # kernel has them apart), which jobacct_gather/cgroup needs: the playbook would refuse the host.
        "slurm_common_jobacct_gather_type": "jobacct_gather/linux",
        "shared_storage_mode": "nfs",
        "shared_storage_path": "/srv/gpupool",
        "gpupool_api_job_root": "/srv/gpupool/jobs",
        # Docker, enroot and pyxis need pinned checksums and a GPU node; no GPU exporter for emulated GPUs.
        "container_runtime_enabled": False,
        "monitoring_gpu_exporter": "none",
    }))
    return inventory


def test_check_diff_on_a_fresh_debian_host_fails_nowhere_and_changes_nothing(fresh_host: FreshHost, tmp_path: Path) -> None:
    fresh_host.run("apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3 python3-apt",
                   timeout=600)
    inventory = one_host_inventory(tmp_path, fresh_host)
    env = ansible_env(ANSIBLE_DIR, ANSIBLE_CONNECTION_PLUGINS=f"{ANSIBLE_DIR / 'connection_plugins'}:{CONNECTION_PLUGINS}")
    completed = subprocess.run(
        [str(venv_tool("ansible-playbook")), "-i", str(inventory), "site.yml", "--check", "--diff"],
        cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    output = completed.stdout + completed.stderr
    (tmp_path / "check.log").write_text(output)
    recap = output[output.rfind("PLAY RECAP"):]
    hosts = {match["host"]: match for match in RECAP_LINE.finditer(recap)}
    assert completed.returncode == 0 and set(hosts) == {"fresh1"}, output[-6000:]
    assert hosts["fresh1"]["failed"] == "0" and hosts["fresh1"]["unreachable"] == "0", recap
    # It says what it would do...
    assert int(hosts["fresh1"]["changed"]) > 0, recap
    # --diff prints apt's plan between a task's header and its result.
    munge_task = re.search(r"TASK \[munge : Install munge\].*?\n(?=TASK |RUNNING HANDLER |PLAY )", output, re.DOTALL)
    assert munge_task and "\nchanged: [fresh1]" in munge_task[0], output[-6000:]
    # ...and did none of it.
    left = fresh_host.run(
        "for package in munge slurmctld slurmd slurmdbd nftables nfs-kernel-server postgresql; do"
        " dpkg-query -W -f '${Status}\\n' $package 2>/dev/null | grep -q '^install ok' && echo $package; done;"
        " for path in /etc/munge/munge.key /etc/slurm/slurm.conf /etc/gpupool-firewall.nft /etc/nfs.conf.d/gpupool.conf; do"
        " [ -e $path ] && echo $path; done; getent passwd gpupool; true")
    assert left.stdout.split() == [], left.stdout
