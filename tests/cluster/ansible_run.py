"""Running the virtualenv's ansible-playbook the way `make cluster` does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

RECAP_LINE = re.compile(
    r"^(?P<host>\S+)\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


@dataclass(frozen=True)
class PlaybookRun:
    output: str
    changed: dict[str, int]


def venv_tool(name: str) -> Path:
    """A console script of the virtualenv running pytest (it holds ansible-core and ansible-lint)."""
    return Path(sys.prefix) / "bin" / name


def ansible_env(ansible_dir: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "SUDO_USER"}
    env.update({"ANSIBLE_CONFIG": str(ansible_dir / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", **extra})
    # ansible-lint and ansible-playbook find each other and their modules through PATH.
    env["PATH"] = f"{venv_tool('python').parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


# The renders (tests/render.yml: every host local, files under a folder) run on Mitogen's strategy.
# ansible-core starts a Python for every task on every host and compiles its module_utils again from
# the module's zip each time: three quarters of a render's CPU (py-spy). Mitogen keeps one Python per
# host and what it imported: a full render of the example site took 102 s of CPU, 24 s with it, the
# same files. Only here: production runs (site.yml over SSH, the netns connection) stay on
# ansible-core's own strategy, which is what operators run.
RENDER_PLAYBOOK = "tests/render.yml"


def render_env(ansible_dir: Path, **extra: str) -> dict[str, str]:
    """ansible_env for tests/render.yml, on Mitogen's linear strategy."""
    import ansible_mitogen  # a test dependency (pyproject's dev extra), not the playbook's

    strategies = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return ansible_env(ansible_dir, ANSIBLE_STRATEGY_PLUGINS=str(strategies), ANSIBLE_STRATEGY="mitogen_linear", **extra)


def run_playbook(ansible_dir: Path, inventory: str, playbook: str, *args: str, **extra_env: str) -> PlaybookRun:
    """Run a playbook from deploy/ansible; fails the test unless every host ends with failed=0."""
    completed = subprocess.run(
        [str(venv_tool("ansible-playbook")), "-i", str(ansible_dir / "inventories" / inventory), playbook, *args],
        cwd=ansible_dir,
        env=(render_env if playbook == RENDER_PLAYBOOK else ansible_env)(ansible_dir, **extra_env),
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
    return PlaybookRun(output=output, changed={host["host"]: int(host["changed"]) for host in hosts})
