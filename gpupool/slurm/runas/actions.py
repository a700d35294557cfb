"""``TenantActions``: what acting as a tenant offers, and which way a process reaches it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpupool.config import Settings
from gpupool.proc import CommandResult
from gpupool.slurm.runas.client import RunasClient
from gpupool.slurm.runas.engine import DirectTenantActions
from gpupool.slurm.runas.request import Sbatch


class TenantActions(Protocol):
    def submit(self, sbatch: Sbatch, *, timeout_s: float) -> CommandResult: ...

    def test_submit(self, sbatch: Sbatch, *, timeout_s: float) -> CommandResult: ...

    def cancel(self, account: str, slurm_job_ids: Sequence[int | str] | None = None, user: str | None = None) -> CommandResult: ...

    def discard(self, account: str, job_id: str) -> None: ...

    def set_budget(self, account: str, gpu_minutes: int | None) -> CommandResult: ...

    def set_member_limits(self, account: str, user: str, gpu_limit: int | None, gpu_minutes: int | None) -> CommandResult: ...



def tenant_actions(settings: Settings) -> TenantActions:
    """The helper's socket when configured, else direct action (which refuses unless root)."""
    if settings.runas_socket:
        return RunasClient(settings)
    return DirectTenantActions(settings)