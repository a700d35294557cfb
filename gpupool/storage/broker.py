"""The run-as helper's side of storage: each request run by the agent as the tenant, its descriptor checked and passed on.

The helper (root) never resolves a tenant's path itself. For each request it
checks the account and the path's text, starts ``gpupool.storage.agent`` as
the account's Unix user (util-linux's setpriv, no supplementary group, umask
0077) with one end of a socket pair, and relays the agent's answer to the
caller, with the file descriptor the agent opened (SCM_RIGHTS). Before it
passes a descriptor on, it checks that it is a regular file on the account's
own filesystem: the agent runs as the tenant, whose other processes may
tamper with it, so what it hands over is believed no further than that.

    files.get      open a file for reading, or list a folder (a page of it)
    files.upload   open (create) the path's upload in progress, locked, for writing
    files.commit   rename a finished upload to its path
    files.abort    remove an upload in progress
    files.delete   delete a file, link or folder, and the path's upload in progress
    files.move     rename within the account's storage
    files.mkdir    make a folder
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import socket
import stat
import time
from pathlib import Path
from typing import Any

from gpupool.config import Settings
from gpupool.errors import BadRequest, ConfigError, TenantError
from gpupool.proc import RunAs, spawn
from gpupool.slurm.tenants import lookup_tenant
from gpupool.storage import agent
from gpupool.storage.paths import account_storage_dir, parse_path

log = logging.getLogger("gpupool.storage.broker")

PREFIX = "files."
OPERATIONS = frozenset(PREFIX + name for name in agent.OPERATIONS)
# Operations whose answer carries a descriptor (a regular file's), when they succeed.
_WITH_DESCRIPTOR = frozenset({"get", "upload"})
_ACCOUNT = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_UPLOAD_KEY = re.compile(r"^[0-9a-f]{64}$")
# Read once: the agent runs from its source on python's command line, as the tenant may not read gpupool's files.
AGENT_SOURCE = Path(agent.__file__).read_text()
MAX_ANSWER_BYTES = 16 * 1024 * 1024
# The agent's own files are the tenant's alone, as everything a job writes (gpupool.slurm.runas.engine.JOB_UMASK).
_AGENT_UMASK = 0o077


def is_file_request(request: dict[str, Any]) -> bool:
    return request.get("op") in OPERATIONS


def _names(value: object, what: str) -> list[str]:
    if not isinstance(value, str):
        raise TenantError(f"{what} must be a path text")
    try:
        return list(parse_path(value).parts)
    except BadRequest as exc:
        raise TenantError(f"{what}: {exc.message}") from exc


def agent_request(settings: Settings, request: dict[str, Any]) -> dict[str, Any]:
    """What the agent is asked: the caller's fields checked and copied one by one, nothing else."""
    op = str(request["op"])[len(PREFIX):]
    account = request.get("account")
    if not isinstance(account, str) or not _ACCOUNT.match(account):
        raise TenantError(f"not a gpupool account name: {account!r}")
    if not settings.storage_root:
        raise ConfigError("this site has no account storage (storage_root is empty)")
    out: dict[str, Any] = {"op": op, "root": account_storage_dir(settings.storage_root, account)}
    out["path"] = _names(request.get("path", ""), "path")
    if op == "move":
        out["target"] = _names(request.get("target"), "target")
    for flag in ("folder", "recursive", "overwrite"):
        if request.get(flag) is True:
            out[flag] = True
    key = request.get("upload_key")
    if key is not None:
        if not isinstance(key, str) or not _UPLOAD_KEY.match(key):
            raise TenantError("upload_key must be 64 hex digits")
        out["upload_key"] = key
    for number in ("ino", "dev", "limit"):
        value = request.get(number)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise TenantError(f"{number} must be a whole number")
            out[number] = value
    after = request.get("after")
    if after is not None:
        if not isinstance(after, str) or len(after) > 1024:
            raise TenantError("after must be a name")
        out["after"] = after
    return out


def _read_answer(sock: socket.socket, deadline: float) -> tuple[bytes, list[int]]:
    """One answer line and the descriptors that came with it, within the deadline."""
    received = bytearray()
    fds: list[int] = []
    try:
        while b"\n" not in received:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
                raise TimeoutError("the storage agent did not answer in time")
            data, new_fds, flags, _ = socket.recv_fds(sock, 65536, 4)
            fds += new_fds
            if flags & socket.MSG_CTRUNC:
                raise OSError("the storage agent sent more descriptors than one")
            if not data:
                break
            received += data
            if len(received) > MAX_ANSWER_BYTES:
                raise OSError("the storage agent's answer is too large")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return bytes(received).split(b"\n", 1)[0], fds


def run_agent(settings: Settings, run_as: RunAs, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The agent's answer to ``request``, run as ``run_as``, and the descriptor it sent (the caller closes it)."""
    deadline = time.monotonic() + settings.storage_op_timeout_s
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        try:
            process = spawn(
                [settings.storage_agent_python, "-I", "-S", "-c", AGENT_SOURCE, str(theirs.fileno())],
                run_as=RunAs(uid=run_as.uid, gid=run_as.gid, umask=_AGENT_UMASK),
                pass_fds=[theirs.fileno()],
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"},
            )
        finally:
            theirs.close()
        try:
            ours.sendall(json.dumps(request).encode() + b"\n")
            line, fds = _read_answer(ours, deadline)
        except (OSError, TimeoutError) as exc:
            process.kill()
            process.wait()
            raise TenantError(f"the storage agent failed: {exc}") from exc
        finally:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - any way it ends, it must not outlive the request
                process.kill()
                process.wait()
    stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    if process.stderr:
        process.stderr.close()
    try:
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        for fd in fds:
            os.close(fd)
        log.warning("storage agent exited %s without an answer: %s", process.returncode, stderr.strip()[-2000:])
        raise TenantError("the storage agent gave no answer") from exc
    if len(fds) > 1:
        for fd in fds:
            os.close(fd)
        raise TenantError("the storage agent sent more than one descriptor")
    return answer, (fds[0] if fds else None)


def check_descriptor(settings: Settings, account: str, fd: int) -> None:
    """A regular file on the account's own filesystem, or TenantError: the agent runs as the tenant and is not trusted further."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise TenantError("the storage agent handed over something other than a regular file")
    volume = os.stat(account_storage_dir(settings.storage_root, account), follow_symlinks=False)
    if info.st_dev != volume.st_dev:
        raise TenantError("the storage agent handed over a file from outside the account's storage")


def handle_file_request(settings: Settings, request: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """Run one storage request as its account's tenant: the answer, and the descriptors to send with it."""
    if os.geteuid() != 0:
        raise ConfigError("storage requests need root: set runas_socket to the gpupool run-as helper's socket")
    asked = agent_request(settings, request)
    tenant = lookup_tenant(settings, request["account"])
    answer, fd = run_agent(settings, tenant.run_as(), asked)
    if fd is None:
        return answer, []
    try:
        if asked["op"] not in _WITH_DESCRIPTOR or answer.get("ok") is not True:
            raise TenantError("the storage agent sent a descriptor with an answer that takes none")
        check_descriptor(settings, request["account"], fd)
    except BaseException:
        os.close(fd)
        raise
    return answer, [fd]
