"""Golden-file comparison shared by the unit tests; ``GPUPOOL_UPDATE_GOLDEN=1`` rewrites them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

UPDATE_GOLDEN = os.environ.get("GPUPOOL_UPDATE_GOLDEN") == "1"


def check_golden(golden_dir: Path, name: str, actual: str) -> None:
    path = golden_dir / name
    expected = path.read_text() if path.exists() else None
    if actual == expected:
        return
    if UPDATE_GOLDEN:
        golden_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        pytest.fail(f"golden {path} rewritten; review the diff, then rerun without GPUPOOL_UPDATE_GOLDEN")
    assert expected is not None, f"golden {path} is missing; create it with GPUPOOL_UPDATE_GOLDEN=1"
    assert actual == expected, f"{name} differs from its golden file (GPUPOOL_UPDATE_GOLDEN=1 regenerates it)"
