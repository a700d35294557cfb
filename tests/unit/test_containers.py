"""docker_runtime_refusal: the docker runtime needs a tenant in the docker group, so it is refused."""

from __future__ import annotations

import pytest

from gpupool.config import Settings
from gpupool.containers import docker_runtime_refusal


@pytest.mark.parametrize(("runtime", "refused"), [("docker", True), ("pyxis", False), ("none", False)])
def test_only_the_docker_runtime_is_refused(runtime: str, refused: bool) -> None:
    refusal = docker_runtime_refusal(Settings(container_runtime=runtime))
    assert (refusal is not None) == refused
    if refusal is not None:
        assert "root on the node" in refusal and "docker group" in refusal and "pyxis" in refusal
