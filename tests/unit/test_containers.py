"""docker_runtime_refusal: docker only for a cluster with a single account."""

from __future__ import annotations

import pytest

from gpupool.config import Settings
from gpupool.containers import docker_runtime_refusal


@pytest.mark.parametrize(
    ("runtime", "accounts", "refused"),
    [
        ("docker", 0, False),
        ("docker", 1, False),
        ("docker", 2, True),
        ("docker", 50, True),
        ("pyxis", 50, False),
        ("none", 50, False),
    ],
)
def test_docker_is_refused_from_the_second_account(runtime: str, accounts: int, refused: bool) -> None:
    refusal = docker_runtime_refusal(Settings(container_runtime=runtime), accounts)
    assert (refusal is not None) == refused
    if refusal is not None:
        assert "root on the node" in refusal and "pyxis" in refusal
