"""The run-as helper's client: ``TenantActions`` over its socket, what the unprivileged API and billing worker use."""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any

from gpupool.config import Settings
from gpupool.errors import CommandFailed, CommandTimedOut, RunasUnavailable, SubmissionUncertain, TenantError
from gpupool.proc import CommandResult
from gpupool.slurm.runas.request import Sbatch


class RunasClient:
    """``TenantActions`` over the helper's socket: what the unprivileged service uses."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.socket_path = settings.runas_socket

    def _call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        sent = False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                # The helper enforces the command's own timeout; this one only guards the helper.
                conn.settimeout(timeout_s + self.settings.runas_timeout_s)
                conn.connect(self.socket_path)
                conn.sendall(json.dumps(request).encode() + b"\n")
                sent = True
                reply = b""
                while not reply.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
        except TimeoutError as exc:
            raise CommandTimedOut([request.get("op", "runas")], timeout_s, "the run-as helper did not answer") from exc
        except OSError as exc:
            if sent:
                raise self._lost_answer(request) from exc
            raise RunasUnavailable(
                f"the gpupool run-as helper is not answering on {self.socket_path}: {exc.strerror or exc}"
            ) from exc
        try:
            answer: dict[str, Any] = json.loads(reply)
        except ValueError as exc:
            raise self._lost_answer(request) from exc
        if answer.get("outcome") == "refused":
            raise TenantError(f"the run-as helper refused: {answer.get('message')}")
        if answer.get("outcome") == "busy":
            # Refused before it read the request: nothing ran.
            raise RunasUnavailable(str(answer.get("message")))
        return answer

    @staticmethod
    def _lost_answer(request: dict[str, Any]) -> SubmissionUncertain:
        """The helper had the request and may have run it: the caller must look before acting again."""
        return SubmissionUncertain(
            f"the gpupool run-as helper took the {request.get('op')} request but gave no answer; it may have run"
        )

    @staticmethod
    def _result(argv: list[str], answer: dict[str, Any]) -> CommandResult:
        outcome = answer["outcome"]
        if outcome == "timed_out":
            raise CommandTimedOut(argv, float(answer.get("timeout_s") or 0), answer.get("stderr") or "")
        if outcome == "failed":
            raise CommandFailed(argv, int(answer.get("returncode") or 1), answer.get("stderr") or "")
        return CommandResult(tuple(argv), int(answer["returncode"]), answer["stdout"], answer["stderr"], 0.0)

    def submit(self, sbatch: Sbatch, *, timeout_s: float) -> CommandResult:
        return self._result(["sbatch", *sbatch.options], self._call(sbatch.wire("submit", timeout_s), timeout_s))

    def test_submit(self, sbatch: Sbatch, *, timeout_s: float) -> CommandResult:
        return self._result(["sbatch", "--test-only", *sbatch.options], self._call(sbatch.wire("test", timeout_s), timeout_s))

    def cancel(self, account: str, slurm_job_ids: Sequence[int | str] | None = None, user: str | None = None) -> CommandResult:
        request: dict[str, Any] = {
            "op": "cancel", "account": account, "slurm_job_ids": None if slurm_job_ids is None else list(slurm_job_ids),
        }
        if user is not None:
            request["user"] = user
        return self._result(["scancel"], self._call(request, self.settings.slurm_query_timeout_s))

    def discard(self, account: str, job_id: str) -> None:
        self._call({"op": "discard", "account": account, "job_id": job_id}, self.settings.slurm_query_timeout_s)

    def set_budget(self, account: str, gpu_minutes: int | None) -> CommandResult:
        request = {"op": "budget", "account": account, "gpu_minutes": gpu_minutes}
        return self._result(["sacctmgr"], self._call(request, self.settings.slurm_query_timeout_s))

    def set_member_limits(self, account: str, user: str, gpu_limit: int | None, gpu_minutes: int | None) -> CommandResult:
        request = {"op": "member_limits", "account": account, "user": user, "gpu_limit": gpu_limit, "gpu_minutes": gpu_minutes}
        return self._result(["sacctmgr"], self._call(request, self.settings.slurm_query_timeout_s))

    def ping(self) -> None:
        self._call({"op": "ping"}, self.settings.runas_timeout_s)