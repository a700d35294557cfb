"""deploy/local/bootstrap-venv.sh stops at a failed install with pip's own error and what to check.

Before, pip's failure was swallowed and `make run` ended much later in
`ModuleNotFoundError: No module named 'flask'`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_an_unreachable_package_index_stops_the_install_with_pips_error(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        # No pip configuration of this machine (its index, wheel folders): only a dead index.
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "5",
    }
    result = subprocess.run(
        [str(REPO / "deploy" / "local" / "bootstrap-venv.sh"), str(venv), "run"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stderr.rstrip().splitlines()[-1]
    assert last.startswith("bootstrap-venv: pip install -e .[deploy] failed (the output above is the tool's own). "), last
    assert "Check that this machine reaches the Python package index" in last
    # pip's own words about the index, above that sentence.
    assert "127.0.0.1" in result.stderr or "No matching distribution" in result.stderr, result.stderr
    assert "ModuleNotFoundError" not in result.stderr
