"""The playbooks parse, and the whole Ansible tree passes ansible-lint's production profile.

Offline: deploy/ansible/.ansible-lint forbids fetching collections, and the
roles use ansible.builtin modules only.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cluster.ansible_run import ansible_env, venv_tool

pytestmark = pytest.mark.ansible


@pytest.mark.parametrize(
    ("inventory", "playbook"),
    [("local", "site.yml"), ("local-gpu", "site.yml"), ("example", "site.yml"), ("example", "tests/render.yml")],
)
def test_playbook_passes_syntax_check(repo_root: Path, inventory: str, playbook: str) -> None:
    ansible_dir = repo_root / "deploy" / "ansible"
    completed = subprocess.run(
        [str(venv_tool("ansible-playbook")), "-i", f"inventories/{inventory}", playbook, "--syntax-check"],
        cwd=ansible_dir,
        env=ansible_env(ansible_dir),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_ansible_lint_production_profile_passes(repo_root: Path) -> None:
    ansible_dir = repo_root / "deploy" / "ansible"
    lint = venv_tool("ansible-lint")
    assert lint.exists(), f"{lint} is missing: ansible-lint is in the dev extra (pip install -e '.[dev]')"
    completed = subprocess.run(
        [str(lint), "--offline", "--profile", "production", "--format", "pep8", "--nocolor"],
        cwd=ansible_dir,
        env=ansible_env(ansible_dir, NO_COLOR="1"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert "Profile 'production' was required, and it passed" in output, output
