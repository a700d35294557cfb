"""The real-GPU tier's pure part (tests/gpu/probe.py): reading nvidia-smi -L and a job's probe output.

The tier itself runs only on a GPU machine (make test-gpu); what it concludes
from a job's output is checked here, on the real H200 capture and on outputs
shaped as PROBE_SCRIPT prints them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.gpu.probe import PROBE_SCRIPT, listed_gpu_uuids, parse_probe

CAPTURES = Path(__file__).resolve().parents[2].parent / "shared" / "external-data" / "nvidia-smi"
UUID_A = "GPU-5b1c7f0e-2d4a-4f3b-9c1e-0a1b2c3d4e5f"
UUID_B = "GPU-9e8d7c6b-5a49-4382-b1a0-f0e1d2c3b4a5"


def test_the_real_h200_list_names_its_one_gpu() -> None:
    capture = CAPTURES / "real-h200-2026-12-04" / "nvidia-smi-L.txt"
    if not capture.exists():
        pytest.skip(f"{capture} is not on this machine (../shared/external-data/SOURCES.md)")

    assert listed_gpu_uuids(capture.read_text()) == ["GPU-00000000-0000-0000-0000-000000000000"]


def test_mig_devices_and_messages_are_not_gpus() -> None:
    text = (
        f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {UUID_A})\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-0c4a1b2e-0000-5000-8000-000000000001)\n"
        f"GPU 1: NVIDIA GeForce RTX 4090 (UUID: {UUID_B})\n"
        "No devices were found\n"
    )

    assert listed_gpu_uuids(text) == [UUID_A, UUID_B]


def test_a_job_holding_one_gpu_of_two() -> None:
    probe = parse_probe(
        "cuda=0\n"
        "smi-rc=0\n"
        f"smi: GPU 0: NVIDIA GeForce RTX 4090 (UUID: {UUID_B})\n"
        "open /dev/nvidia0 denied: dd: failed to open '/dev/nvidia0': Operation not permitted\n"
        "open /dev/nvidia1 ok\n"
    )

    assert probe.cuda_visible_devices == "0"
    assert probe.gpu_uuids == [UUID_B]
    assert probe.opened == {"/dev/nvidia0": False, "/dev/nvidia1": True}
    assert probe.open_errors == {"/dev/nvidia0": "dd: failed to open '/dev/nvidia0': Operation not permitted"}


def test_a_job_without_gpus() -> None:
    probe = parse_probe(
        "cuda=unset\n"
        "smi-rc=6\n"
        "smi: No devices were found\n"
        "open /dev/nvidia0 denied: dd: failed to open '/dev/nvidia0': Operation not permitted\n"
    )

    assert probe.cuda_visible_devices is None
    assert probe.smi_returncode == 6
    assert probe.gpu_uuids == []
    assert probe.opened == {"/dev/nvidia0": False}


def test_output_the_probe_cannot_have_printed_is_refused() -> None:
    with pytest.raises(ValueError, match="no smi-rc= line"):
        parse_probe("cuda=0\n")
    with pytest.raises(ValueError, match="unexpected line"):
        parse_probe("smi-rc=0\nsrun: error: something else\n")


def test_the_probe_script_reports_what_this_machine_lets_it_open(tmp_path: Path) -> None:
    # No GPU here: nvidia-smi is a stand-in, and the device files are a plain
    # file and a missing one; the kernel's answer to each open is what counts.
    (tmp_path / "nvidia-smi").write_text(f"#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: {UUID_A})'\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    present, missing = tmp_path / "nvidia0", tmp_path / "nvidia1"
    present.write_bytes(b"")
    completed = subprocess.run(
        ["/bin/sh", "-c", PROBE_SCRIPT, "probe", str(present), str(missing)],
        capture_output=True, text=True, timeout=30, check=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "3"},
    )

    probe = parse_probe(completed.stdout)

    assert (probe.cuda_visible_devices, probe.smi_returncode, probe.gpu_uuids) == ("3", 0, [UUID_A])
    assert probe.opened == {str(present): True, str(missing): False}
    assert "No such file or directory" in probe.open_errors[str(missing)]
