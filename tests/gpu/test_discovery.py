"""slurm-gpu-discover against the real nvidia-smi: every GPU, with its type and device file."""

from __future__ import annotations

import os
import re
import stat
from typing import Any

import pytest

from tests.gpu.host import HOST_GPU_LIST
from tests.gpu.probe import listed_gpu_uuids

pytestmark = pytest.mark.gpu

NVIDIA_MAJOR = 195  # the driver's character-device major for /dev/nvidiaN and nvidiactl
TYPE_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


def test_discovery_finds_every_gpu_the_driver_lists(discovery: dict[str, Any], host_gpus: dict[str, str]) -> None:
    assert discovery["status"] == "ok", discovery["message"]
    found = [gpu["pci_bus_id"] for gpu in discovery["gpus"]] + [gpu["pci_bus_id"] for gpu in discovery["skipped"]]
    assert sorted(found) == sorted(host_gpus), "discovery and nvidia-smi disagree on the GPUs"
    assert len(found) == len(listed_gpu_uuids(HOST_GPU_LIST))
    assert discovery["gpus"], f"every GPU was skipped: {discovery['skipped']}"


def test_each_gpu_has_a_type_and_its_own_device_file(discovery: dict[str, Any]) -> None:
    files = [gpu["file"] for gpu in discovery["gpus"]]
    assert len(set(files)) == len(files)
    for gpu in discovery["gpus"]:
        assert TYPE_PATTERN.match(gpu["type"]), gpu
        mode = os.stat(gpu["file"])
        assert stat.S_ISCHR(mode.st_mode), f"{gpu['file']} is not a character device"
        assert (os.major(mode.st_rdev), os.minor(mode.st_rdev)) == (NVIDIA_MAJOR, gpu["minor"]), gpu
    counts = {entry["type"]: entry["count"] for entry in discovery["types"]}
    assert sum(counts.values()) == len(discovery["gpus"])
    assert discovery["gres"] == ",".join(f"gpu:{name}:{counts[name]}" for name in sorted(counts))


def test_gres_conf_lines_name_every_device_file(discovery: dict[str, Any], node_name: str) -> None:
    expected = [
        f"NodeName={node_name} Name=gpu Type={gpu['type']} File={gpu['file']}" for gpu in discovery["gpus"]
    ]
    # Cores= follows only where the topology binds GPUs to some cores (the script's docstring).
    assert [re.sub(r" Cores=\S+$", "", line) for line in discovery["gres_conf"]] == expected
