"""Run ``sbatch`` and ``scancel`` as an account's tenant user, and nothing else.

The API runs as an unprivileged service user under ``NoNewPrivileges``, which
rules out sudo and every setuid helper. So a small root process,
``gpupool runas serve``, listens on a Unix socket that only the service group
can open, checks each caller's uid with ``SO_PEERCRED``, and acts as a tenant
only through the three operations below. Requests carry data, never command
lines: the helper builds every argv itself, checks each sbatch option against
the renderer's fixed list, creates the job folder without following links,
and runs the command as the tenant with a minimal environment. There is no
shell anywhere.

    submit   write the job's script into its new folder, run sbatch as the tenant
    cancel   scancel the given jobs (or all of the account's) as the tenant
    discard  remove a job folder whose sbatch Slurm refused

``TenantActions`` does the work and is what the helper runs; an operator's
shell that is root uses it directly. ``RunasClient`` is the same interface
over the socket, for the API and the billing worker.

Wire format: one JSON object per line each way, one request per connection.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pwd
import re
import shutil
import socket
import socketserver
import struct
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

from gpupool.config import Settings, load_settings
from gpupool.errors import (
    CommandFailed,
    CommandTimedOut,
    ConfigError,
    GpupoolError,
    RunasUnavailable,
    SubmissionUncertain,
    TenantError,
)
from gpupool.proc import CommandResult, minimal_env, run_command
from gpupool.render import job_tag
from gpupool.tenants import Tenant, ensure_tenant_folder, lookup_tenant, service_gid

log = logging.getLogger("gpupool.runas")

SCRIPT_NAME = "job.sbatch"
MAX_REQUEST_BYTES = 1024 * 1024
_JOB_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# The options gpupool.render emits; anything else is refused, whatever the caller.
_SUBMIT_OPTIONS = frozenset(
    {
        "--job-name", "--account", "--partition", "--nodes", "--ntasks", "--cpus-per-task", "--mem", "--gres",
        "--time", "--chdir", "--output", "--error", "--comment", "--ignore-pbs", "--container-image",
        "--container-mounts", "--container-workdir", "--container-name", "--no-container-mount-home",
        "--no-container-remap-root",
    }
)
# Options whose value must be the job's own folder or a file directly in it.
_PATH_OPTIONS = ("--chdir", "--output", "--error", "--container-workdir")
_SO_PEERCRED = struct.Struct("3i")


class TenantActions(Protocol):
    def submit(self, account: str, job_id: str, script: str, options: Sequence[str], *, timeout_s: float) -> CommandResult: ...

    def cancel(self, account: str, slurm_job_ids: Sequence[int] | None = None) -> CommandResult: ...

    def discard(self, account: str, job_id: str) -> None: ...


def _check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise TenantError(f"not a gpupool job id: {job_id!r}")
    return job_id


def check_submit_options(options: Sequence[str], account: str, job_id: str, job_dir: Path) -> list[str]:
    """The sbatch options, if every one is the renderer's and names this account and this job's folder."""
    if not isinstance(options, list) or not all(isinstance(option, str) for option in options):
        raise TenantError("sbatch options must be a list of strings")
    seen: dict[str, str] = {}
    for option in options:
        name, _, value = option.partition("=")
        if name not in _SUBMIT_OPTIONS or "\x00" in option:
            raise TenantError(f"sbatch option {name!r} is not one gpupool submits")
        if name in seen:
            raise TenantError(f"sbatch option {name!r} given twice")
        seen[name] = value
    if seen.get("--account") != account:
        raise TenantError(f"a job of account {account!r} must be submitted with --account={account}")
    if seen.get("--comment") != job_tag(job_id):
        raise TenantError("the job's comment must be its own gpupool tag")
    for name in _PATH_OPTIONS:
        if name in seen:
            path = Path(seen[name])
            if path != job_dir and path.parent != job_dir:
                raise TenantError(f"{name} must point into the job's own folder {job_dir}")
    return list(options)


class DirectTenantActions:
    """Acts as tenants itself: needs root. The helper's engine, and the operator's when root."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def _tenant(self, account: str) -> Tenant:
        if os.geteuid() != 0:
            raise ConfigError(
                "acting as a tenant needs root: set runas_socket to the gpupool runas helper's socket, "
                "or run this command as root"
            )
        return lookup_tenant(self.settings, account)

    def _env(self, tenant: Tenant, job_dir: Path) -> dict[str, str]:
        # Exported to the job by sbatch: nothing of root's or the service's environment.
        return minimal_env({"PATH": self.settings.job_path, "HOME": str(job_dir), "USER": tenant.user, "LOGNAME": tenant.user})

    def submit(self, account: str, job_id: str, script: str, options: Sequence[str], *, timeout_s: float) -> CommandResult:
        tenant = self._tenant(account)
        _check_job_id(job_id)
        job_dir = Path(self.settings.job_root) / account / job_id
        argv_options = check_submit_options(list(options), account, job_id, job_dir)
        if not isinstance(script, str) or len(script.encode()) > MAX_REQUEST_BYTES:
            raise TenantError("the job script must be text of at most 1 MiB")
        ensure_tenant_folder(self.settings, tenant, job_id)
        self._write_script(job_dir, script, tenant)
        argv = [self.settings.slurm_bin("sbatch"), "--parsable", *argv_options, str(job_dir / SCRIPT_NAME)]
        return run_command(
            argv, timeout_s=timeout_s, env=self._env(tenant, job_dir), run_as=tenant.run_as(), cwd=str(job_dir)
        )

    def _write_script(self, job_dir: Path, script: str, tenant: Tenant) -> None:
        dir_fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fd = os.open(
                SCRIPT_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640, dir_fd=dir_fd
            )
            with os.fdopen(fd, "w") as handle:
                handle.write(script)
                os.fchown(handle.fileno(), tenant.uid, service_gid(self.settings))
        finally:
            os.close(dir_fd)

    def cancel(self, account: str, slurm_job_ids: Sequence[int] | None = None) -> CommandResult:
        tenant = self._tenant(account)
        if slurm_job_ids is None:
            targets = [f"--account={account}", f"--user={tenant.user}"]
        else:
            if not slurm_job_ids or not all(isinstance(job, int) and not isinstance(job, bool) and job > 0 for job in slurm_job_ids):
                raise TenantError("scancel needs positive Slurm job ids")
            targets = [str(job) for job in slurm_job_ids]
        return run_command(
            [self.settings.slurm_bin("scancel"), *targets],
            timeout_s=self.settings.slurm_query_timeout_s,
            env=minimal_env({"HOME": "/", "USER": tenant.user}),
            run_as=tenant.run_as(),
            cwd="/",
        )

    def discard(self, account: str, job_id: str) -> None:
        self._tenant(account)
        _check_job_id(job_id)
        account_dir = Path(self.settings.job_root) / account
        account_fd = os.open(account_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            # rmtree with dir_fd never follows a link the tenant may have planted.
            shutil.rmtree(job_id, dir_fd=account_fd, ignore_errors=True)
        finally:
            os.close(account_fd)


# -- the socket -----------------------------------------------------------------------


def _result_payload(result: CommandResult) -> dict[str, Any]:
    return {"outcome": "ok", "returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr}


class _Handler(socketserver.StreamRequestHandler):
    server: RunasServer

    def handle(self) -> None:
        pid, uid, _gid = _SO_PEERCRED.unpack(
            self.connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _SO_PEERCRED.size)
        )
        if uid not in self.server.allowed_uids:
            log.warning("refused a request from uid %s (pid %s): not the service", uid, pid)
            self._reply({"outcome": "refused", "message": f"uid {uid} may not use the gpupool run-as helper"})
            return
        line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
        try:
            if len(line) > MAX_REQUEST_BYTES:
                raise TenantError("request too large")
            request = json.loads(line)
            if not isinstance(request, dict):
                raise TenantError("a request is a JSON object")
            reply = self._dispatch(request)
        except (CommandTimedOut, CommandFailed) as exc:
            timed_out = isinstance(exc, CommandTimedOut)
            reply = {
                "outcome": "timed_out" if timed_out else "failed",
                "returncode": getattr(exc, "returncode", None),
                "stderr": exc.stderr,
                "timeout_s": exc.details.get("timeout_s"),
            }
        except (TenantError, ConfigError, ValueError, KeyError, TypeError, OSError) as exc:
            message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            log.warning("refused a request from uid %s: %s", uid, message)
            reply = {"outcome": "refused", "message": message}
        self._reply(reply)

    def _dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        actions = self.server.actions
        op, account = request.get("op"), request.get("account")
        if op == "ping":
            return {"outcome": "ok"}
        if not isinstance(account, str):
            raise TenantError("the request names no account")
        if op == "submit":
            timeout_s = min(float(request["timeout_s"]), self.server.max_timeout_s)
            result = actions.submit(account, request["job_id"], request["script"], request["options"], timeout_s=timeout_s)
            log.info("sbatch as %s for job %s: %s", account, request["job_id"], result.stdout.strip())
            return _result_payload(result)
        if op == "cancel":
            ids = request.get("slurm_job_ids")
            result = actions.cancel(account, None if ids is None else list(ids))
            log.info("scancel as %s: %s", account, "every job" if ids is None else ids)
            return _result_payload(result)
        if op == "discard":
            actions.discard(account, request["job_id"])
            return {"outcome": "ok"}
        raise TenantError(f"unknown operation {op!r}")

    def _reply(self, reply: dict[str, Any]) -> None:
        self.wfile.write(json.dumps(reply).encode() + b"\n")


class RunasServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, socket_path: str, actions: DirectTenantActions, allowed_uids: Iterable[int], group_gid: int) -> None:
        self.actions = actions
        self.allowed_uids = frozenset(allowed_uids)
        self.max_timeout_s = max(actions.settings.slurm_submit_timeout_s, actions.settings.slurm_query_timeout_s) * 2
        path = Path(socket_path)
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        os.chown(path.parent, 0, group_gid)
        os.chmod(path.parent, 0o750)
        path.unlink(missing_ok=True)
        old_umask = os.umask(0o177)
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old_umask)
        os.chown(path, 0, group_gid)
        os.chmod(path, 0o660)


def serve(settings: Settings, socket_path: str, extra_users: Sequence[str] = (), ready: threading.Event | None = None) -> None:
    """Run the helper until killed: root only, callers limited to the service user (and root)."""
    if os.geteuid() != 0:
        raise ConfigError("gpupool runas serve must run as root")
    allowed = {0, pwd.getpwnam(settings.service_user).pw_uid}
    allowed |= {pwd.getpwnam(user).pw_uid for user in extra_users}
    server = RunasServer(socket_path, DirectTenantActions(settings), allowed, service_gid(settings))
    log.info("gpupool run-as helper on %s for uids %s", socket_path, sorted(allowed))
    if ready is not None:
        ready.set()
    with server:
        server.serve_forever()


def exec_lean_helper(socket_path: str, extra_users: Sequence[str] = ()) -> NoReturn:
    """Become ``python -m gpupool.runas``: the helper without the imports of whoever started it.

    The helper forks once per sbatch, and a fork that switches user cannot use
    vfork, so each one copies the helper's page tables: in a process holding the
    CLI's imports (SQLAlchemy, Flask, ~70 MB) a fork and exec costs about twice
    the CPU it does in one holding only this module's (~19 MB).
    """
    argv = [sys.executable, "-m", "gpupool.runas", "--socket", socket_path]
    for user in extra_users:
        argv += ["--allow-user", user]
    os.execv(sys.executable, argv)


def main(argv: Sequence[str] | None = None) -> int:
    """``gpupool runas serve`` once it has shed the CLI: settings from the environment, as the CLI reads them."""
    parser = argparse.ArgumentParser(prog="python -m gpupool.runas", description="The gpupool run-as helper (root).")
    parser.add_argument("--socket", required=True, help="socket path")
    parser.add_argument("--allow-user", action="append", default=[], help="another Unix user allowed to connect")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(load_settings(), args.socket, args.allow_user)
    except GpupoolError as exc:
        print(f"gpupool: error: {exc.message}", file=sys.stderr)
        return 1
    return 0


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

    def submit(self, account: str, job_id: str, script: str, options: Sequence[str], *, timeout_s: float) -> CommandResult:
        request = {"op": "submit", "account": account, "job_id": job_id, "script": script, "options": list(options), "timeout_s": timeout_s}
        return self._result(["sbatch", *options], self._call(request, timeout_s))

    def cancel(self, account: str, slurm_job_ids: Sequence[int] | None = None) -> CommandResult:
        request = {"op": "cancel", "account": account, "slurm_job_ids": None if slurm_job_ids is None else list(slurm_job_ids)}
        return self._result(["scancel"], self._call(request, self.settings.slurm_query_timeout_s))

    def discard(self, account: str, job_id: str) -> None:
        self._call({"op": "discard", "account": account, "job_id": job_id}, self.settings.slurm_query_timeout_s)

    def ping(self) -> None:
        self._call({"op": "ping"}, self.settings.runas_timeout_s)


def tenant_actions(settings: Settings) -> TenantActions:
    """The helper's socket when configured, else direct action (which refuses unless root)."""
    if settings.runas_socket:
        return RunasClient(settings)
    return DirectTenantActions(settings)


if __name__ == "__main__":
    sys.exit(main())
