"""``Sbatch``: one sbatch as a tenant, passed whole from the API through the helper's socket to its engine.

One value rather than the same seven arguments at every layer (``SlurmClient``,
``TenantActions``, the socket's JSON, the engine), so that a new submit option is
added in one place and cannot be forgotten on one side of the socket.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.errors import TenantError


@dataclass(frozen=True)
class Sbatch:
    """What to submit and as whom: the account's own user, or its member user ``user``.

    Every field is checked by the engine (``gpupool.slurm.runas.checks``), never trusted here.
    """

    account: str
    job_id: str
    script: str
    options: Sequence[str]
    session_secret: str | None = None
    array_values: Sequence[str] | None = None
    user: str | None = None

    def wire(self, op: str, timeout_s: float) -> dict[str, Any]:
        """The helper's request for ``op`` (submit, or test: ``sbatch --test-only``)."""
        request: dict[str, Any] = {
            "op": op, "account": self.account, "job_id": self.job_id, "script": self.script,
            "options": list(self.options), "timeout_s": timeout_s,
        }
        if self.session_secret is not None:
            request["session_secret"] = self.session_secret
        if self.array_values is not None:
            request["array_values"] = list(self.array_values)
        if self.user is not None:
            request["user"] = self.user
        return request

    @classmethod
    def from_wire(cls, request: dict[str, Any]) -> Sbatch:
        """The request the helper read; types checked where a wrong one would not fail in the checks."""
        secret, user = request.get("session_secret"), request.get("user")
        if secret is not None and not isinstance(secret, str):
            raise TenantError("session_secret must be a string")
        if user is not None and not isinstance(user, str):
            raise TenantError("user must be a string")
        return cls(
            request["account"], request["job_id"], request["script"], request["options"],
            session_secret=secret, array_values=request.get("array_values"), user=user,
        )
