"""Which container runtimes are safe with which tenants.

The ``docker`` runtime runs containers through dockerd, and whoever may talk to
dockerd (the docker group) is root on the node. A tenant's job runs any code,
so a tenant in the docker group could read and kill every other account's work
and borrow root's powers; even a single-account cluster would hand its one
customer the node (and the next account created would inherit that). gpupool
therefore never puts a tenant in the docker group (the container_runtime role
refuses to), and without it the docker runtime cannot run a container: it is
refused. ``pyxis`` (enroot) runs containers rootless, inside the job's cgroup,
as the tenant, and is safe with any number of accounts.
"""

from __future__ import annotations

from gpupool.config import Settings

DOCKER_REFUSAL = (
    "the docker runtime needs the account's user in the docker group, which is root on the node, and "
    "gpupool never puts a tenant there; use pyxis (container_runtime = \"pyxis\")"
)


def docker_runtime_refusal(settings: Settings) -> str | None:
    """Why containers must be refused under these settings, or None when they may run."""
    if settings.container_runtime == "docker":
        return DOCKER_REFUSAL
    return None
