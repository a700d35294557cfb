"""The run-as helper's socket: who may call, how a request is read and answered, and how many at once.

Wire format: one JSON object per line each way, one request per connection.
A connection that sends no whole request within ``runas_timeout_s`` is closed;
beyond ``runas_max_connections`` at once, a new one is answered ``busy``. A
storage request's opened file comes back as a descriptor on the answer's first
bytes (SCM_RIGHTS). Only uids the helper was started for (the service user,
root, any ``--allow-user``) are served, as ``SO_PEERCRED`` says.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpupool.config import Settings
from gpupool.errors import CommandFailed, CommandTimedOut, ConfigError, TenantError
from gpupool.proc import CommandResult
from gpupool.slurm.runas.checks import MAX_REQUEST_BYTES
from gpupool.slurm.runas.engine import DirectTenantActions
from gpupool.slurm.runas.request import Sbatch
from gpupool.slurm.tenants import service_gid
from gpupool.storage.broker import handle_file_request, is_file_request

# The package's name, as the helper's log lines have always carried it.
log = logging.getLogger("gpupool.slurm.runas")

_SO_PEERCRED = struct.Struct("3i")
# How long a connection over runas_max_connections waits for a slot before it is refused.
BUSY_WAIT_S = 2.0


def _result_payload(result: CommandResult) -> dict[str, Any]:
    return {"outcome": "ok", "returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr}


class _SilentClient(Exception):
    """The caller sent no whole request in time."""


class _Handler(socketserver.BaseRequestHandler):
    server: RunasServer
    request: socket.socket

    def handle(self) -> None:
        fds: list[int] = []
        try:
            self._handle(fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _handle(self, fds: list[int]) -> None:
        pid, uid, _gid = _SO_PEERCRED.unpack(
            self.request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _SO_PEERCRED.size)
        )
        if uid not in self.server.allowed_uids:
            log.warning("refused a request from uid %s (pid %s): not the service", uid, pid)
            self._reply({"outcome": "refused", "message": f"uid {uid} may not use the gpupool run-as helper"})
            return
        try:
            line = self._read_request()
            request = json.loads(line)
            if not isinstance(request, dict):
                raise TenantError("a request is a JSON object")
            if is_file_request(request):
                reply, opened = handle_file_request(self.server.actions.settings, request)
                fds += opened
            else:
                reply = self._dispatch(request)
        except _SilentClient:
            timeout_s = self.server.request_timeout_s
            log.warning("closed a connection from uid %s (pid %s): no whole request within %g s", uid, pid, timeout_s)
            reply = {"outcome": "refused", "message": f"no whole request within {timeout_s:g} s; closing the connection"}
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
        self._reply(reply, fds)

    def _read_request(self) -> bytes:
        """One line, within request_timeout_s in all: a caller that trickles bytes is closed too."""
        deadline = time.monotonic() + self.server.request_timeout_s
        received = bytearray()
        while b"\n" not in received:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _SilentClient()
            self.request.settimeout(remaining)
            try:
                chunk = self.request.recv(65536)
            except TimeoutError as exc:
                raise _SilentClient() from exc
            if not chunk:
                break
            received += chunk
            if len(received) > MAX_REQUEST_BYTES + 1:
                raise TenantError("request too large")
        line = bytes(received).split(b"\n", 1)[0]
        if len(line) > MAX_REQUEST_BYTES:
            raise TenantError("request too large")
        return line

    def _dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        actions = self.server.actions
        op, account = request.get("op"), request.get("account")
        if op == "ping":
            return {"outcome": "ok"}
        if not isinstance(account, str):
            raise TenantError("the request names no account")
        user = request.get("user")
        if user is not None and not isinstance(user, str):
            raise TenantError("user must be a string")
        if op == "submit":
            timeout_s = min(float(request["timeout_s"]), self.server.max_timeout_s)
            result = actions.submit(Sbatch.from_wire(request), timeout_s=timeout_s)
            log.info("sbatch as %s (%s) for job %s: %s", account, user or "account", request["job_id"], result.stdout.strip())
            return _result_payload(result)
        if op == "test":
            timeout_s = min(float(request["timeout_s"]), self.server.max_timeout_s)
            return _result_payload(actions.test_submit(Sbatch.from_wire(request), timeout_s=timeout_s))
        if op == "cancel":
            ids = request.get("slurm_job_ids")
            result = actions.cancel(account, None if ids is None else list(ids), user=user)
            log.info("scancel as %s (%s): %s", account, user or "account", "every job" if ids is None else ids)
            return _result_payload(result)
        if op == "discard":
            actions.discard(account, request["job_id"])
            return {"outcome": "ok"}
        if op == "budget":
            result = actions.set_budget(account, request.get("gpu_minutes"))
            log.info("budget of %s: %s GPU-minutes", account, request.get("gpu_minutes"))
            return _result_payload(result)
        if op == "member_limits":
            if user is None:
                raise TenantError("member_limits names the member's user")
            result = actions.set_member_limits(account, user, request.get("gpu_limit"), request.get("gpu_minutes"))
            log.info("limits of %s in %s: %s GPUs, %s GPU-minutes", user, account, request.get("gpu_limit"), request.get("gpu_minutes"))
            return _result_payload(result)
        raise TenantError(f"unknown operation {op!r}")

    def _reply(self, reply: dict[str, Any], fds: Sequence[int] = ()) -> None:
        self.request.settimeout(self.server.request_timeout_s)
        data = json.dumps(reply).encode() + b"\n"
        try:
            if fds and reply.get("outcome") is None:
                # The descriptor rides on the answer's first bytes (SCM_RIGHTS); the caller closes its copy.
                data = data[socket.send_fds(self.request, [data], list(fds)):]
            self.request.sendall(data)
        except OSError as exc:
            log.warning("could not answer %s: %s", reply.get("outcome"), exc)


class RunasServer(socketserver.UnixStreamServer):
    # Connections past runas_max_connections wait in the listen queue for a slot
    # (BUSY_WAIT_S). socketserver's backlog of 5 would refuse the sixth waiting
    # caller at connect() instead (EAGAIN: the API's 503 runas_unavailable).
    request_queue_size = 128

    def __init__(self, socket_path: str, actions: DirectTenantActions, allowed_uids: Iterable[int], group_gid: int) -> None:
        self.actions = actions
        self.allowed_uids = frozenset(allowed_uids)
        settings = actions.settings
        self.max_timeout_s = max(settings.slurm_submit_timeout_s, settings.slurm_query_timeout_s) * 2
        self.request_timeout_s = settings.runas_timeout_s
        self.max_connections = settings.runas_max_connections
        self._slots = threading.BoundedSemaphore(self.max_connections)
        # One thread per slot, each serving request after request: starting a thread
        # for every connection cost the helper more CPU than reading and checking its request.
        self._threads = ThreadPoolExecutor(max_workers=self.max_connections, thread_name_prefix="runas")
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

    def process_request(self, request: Any, client_address: Any) -> None:
        # In the accepting thread: while every slot is taken, new connections wait
        # in the listen queue instead of each costing a thread.
        if not self._slots.acquire(timeout=BUSY_WAIT_S):
            self._refuse_busy(request)
            return
        try:
            self._threads.submit(self._serve, request, client_address)
        except BaseException:
            self._slots.release()
            self.shutdown_request(request)
            raise

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # as socketserver does: log it, serve the next
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _refuse_busy(self, request: socket.socket) -> None:
        message = f"the run-as helper is busy: {self.max_connections} requests in progress; try again"
        log.warning("refused a connection: %s", message)
        try:
            request.settimeout(1.0)
            request.sendall(json.dumps({"outcome": "busy", "message": message}).encode() + b"\n")
        except OSError:
            pass
        finally:
            self.shutdown_request(request)


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