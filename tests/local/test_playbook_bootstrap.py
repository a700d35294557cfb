"""The playbook's first tasks (roles/common/tasks/bootstrap.yml) stop at once, with a sentence, on a host name that does not resolve.

Before, the playbook went on to "Wait until it answers | slurmdbd" and retried
for over five minutes while sacctmgr failed with getaddrinfo errors.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"

BOOTSTRAP_ONLY = """\
- name: The first tasks of site.yml
  hosts: localhost
  connection: local
  tasks:
    - name: Install what the playbook's modules need
      ansible.builtin.import_role:
        name: common
        tasks_from: bootstrap
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a UTS namespace needs root")
@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="needs the virtualenv's ansible-core (make venv)")
def test_an_unresolved_host_name_fails_the_first_task_with_what_to_do(tmp_path: Path) -> None:
    playbook = tmp_path / "bootstrap.yml"
    playbook.write_text(BOOTSTRAP_ONLY)
    name = "gp-playbook-nowhere.invalid"
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "ANSIBLE_ROLES_PATH": str(REPO / "deploy" / "ansible" / "roles"),
        "ANSIBLE_NOCOLOR": "1",
    }
    result = subprocess.run(
        ["unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$@"', "sh",
         str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-e", "ansible_python_interpreter=/usr/bin/python3", str(playbook)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0, result.stdout
    assert (
        f"This machine's host name {name} does not resolve (getent ahosts finds no address), and Slurm's daemons "
        f"and sacctmgr reach each other by it. Add a line such as '127.0.1.1 {name}' to /etc/hosts, "
        "then run the playbook again." in result.stdout
    ), result.stdout
    assert "failed=1" in result.stdout
