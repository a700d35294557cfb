"""gpupool-gpu-check against the real nvidia-smi and /dev/kmsg: a healthy GPU node passes, quickly.

It runs with --dry-run and a config of its own (gres.conf from discovery, state
in a temporary folder), so it never drains the node whatever it finds; what it
found and how long it took are printed (never asserted on: timing is the
machine's business).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupool.proc import run_command

pytestmark = pytest.mark.gpu


def test_health_check_finds_the_node_healthy(discovery: dict[str, Any], node_name: str, tmp_path: Path) -> None:
    gres_conf = tmp_path / "gres.conf"
    gres_conf.write_text("".join(f"{line}\n" for line in discovery["gres_conf"]), encoding="utf-8")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    config = tmp_path / "gpu-check.json"
    config.write_text(
        json.dumps(
            {
                "node_name": node_name,
                "gres_conf": str(gres_conf),
                "nvidia_smi": shutil.which("nvidia-smi") or "/usr/bin/nvidia-smi",
                "kernel_log": "/dev/kmsg",
                "state_dir": str(state_dir),
                "drain": False,
                "end_jobs": False,
            }
        ),
        encoding="utf-8",
    )
    check = [sys.executable, "-m", "gpupool.gpu_health.main", "--config", str(config), "--dry-run"]
    result = run_command(check, timeout_s=60.0, check=False)
    print(f"gpupool-gpu-check: exit {result.returncode} in {result.duration_s:.3f} s\n{result.stderr}")
    assert "would drain" not in result.stderr
    assert result.returncode == 0, result.stderr
    findings = json.loads((state_dir / "state.json").read_text(encoding="utf-8"))["last_findings"]
    assert [finding for finding in findings if finding["action"] == "drain"] == []

    # A second run reads only what the kernel logged since the first: the steady state slurmd sees.
    again = run_command(check, timeout_s=60.0, check=False)
    print(f"gpupool-gpu-check (second run): exit {again.returncode} in {again.duration_s:.3f} s\n{again.stderr}")
    assert again.returncode == 0, again.stderr
