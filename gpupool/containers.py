"""Which container runtimes are safe with which tenants.

The ``docker`` runtime runs containers through dockerd, and whoever may talk to
dockerd (the docker group) is root on the node: every tenant's jobs would run
as a user that can read and kill every other tenant's work. That is acceptable
only while the cluster has one tenant. ``pyxis`` (enroot) runs containers
rootless, inside the job's cgroup, as the tenant, and is safe with any number.
"""

from __future__ import annotations

from gpupool.config import Settings

DOCKER_REFUSAL = (
    "the docker runtime gives root on the node to anyone in the docker group; with more than one "
    "account, use pyxis (container_runtime = \"pyxis\")"
)


def docker_runtime_refusal(settings: Settings, account_count: int) -> str | None:
    """Why containers must be refused with ``account_count`` accounts, or None when they may run."""
    if settings.container_runtime == "docker" and account_count > 1:
        return DOCKER_REFUSAL
    return None
