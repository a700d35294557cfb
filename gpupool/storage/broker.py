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

    outputs.get    the same as files.get, in a job's output folder (``job_root/<account>/<job>/output``)
    outputs.tar    the job's output folder as a tar stream: the read end of a pipe the agent's child writes

A job's outputs are read as the job folder's owner, the user the job ran as
(the member's own, or the account's): the helper finds it from the folder
itself, opened without following a link, and checks that it is a user of that
account (``gpupool.slurm.tenants.lookup_member``) before it acts as it. A job
folder that is missing, or whose owner is not one of the account's users, is
``not_found``, as a job of another account is.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
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
from gpupool.render import output_dir
from gpupool.slurm.runas.checks import job_folder
from gpupool.slurm.tenants import Tenant, lookup_member, lookup_tenant
from gpupool.storage import agent
from gpupool.storage.paths import account_storage_dir, parse_path

log = logging.getLogger("gpupool.storage.broker")

PREFIX = "files."
OUTPUTS_PREFIX = "outputs."
# A job's outputs are read, never written, through the API.
_OUTPUT_OPERATIONS = frozenset({"get", "tar"})
OPERATIONS = frozenset(PREFIX + name for name in agent.OPERATIONS if name != "tar") | frozenset(
    OUTPUTS_PREFIX + name for name in _OUTPUT_OPERATIONS
)
# Operations whose answer carries a descriptor when they succeed: a regular file's, or (tar) a pipe's.
_WITH_DESCRIPTOR = frozenset({"get", "upload", "tar"})
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
    op = str(request["op"]).split(".", 1)[1]
    account = request.get("account")
    if not isinstance(account, str) or not _ACCOUNT.match(account):
        raise TenantError(f"not a gpupool account name: {account!r}")
    out: dict[str, Any] = {"op": op}
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


def check_descriptor(fd: int, device: int, *, pipe: bool = False) -> None:
    """A regular file on ``device`` (or, for a tar stream, a pipe), or TenantError: the agent runs as the tenant and is not trusted further."""
    info = os.fstat(fd)
    if pipe:
        if not stat.S_ISFIFO(info.st_mode):
            raise TenantError("the storage agent handed over something other than a pipe")
        return
    if not stat.S_ISREG(info.st_mode):
        raise TenantError("the storage agent handed over something other than a regular file")
    if info.st_dev != device:
        raise TenantError("the storage agent handed over a file from outside the folder it was asked about")


def job_folder_owner(settings: Settings, account: str, job_id: object) -> tuple[Tenant, str, int] | None:
    """The user a job folder belongs to, checked to be one of ``account``'s; its path and device. None: no such folder of the account's.

    The folder is opened without following a link; the job root and the
    account's folder above it are root's (gpupool.slurm.tenants), so no tenant
    can put anything else in its place.
    """
    folder = str(job_folder(settings, account, str(job_id) if isinstance(job_id, str) else ""))
    try:
        fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        tenant = lookup_member(settings, account, pwd.getpwuid(info.st_uid).pw_name)
    except (KeyError, TenantError) as exc:
        log.warning("job folder %s belongs to uid %s, not a user of account %s: %s", folder, info.st_uid, account, exc)
        return None
    return tenant, folder, info.st_dev


def _where(settings: Settings, request: dict[str, Any]) -> tuple[Tenant, str, int] | None:
    """Who the agent runs as, the folder it works beneath, and the device a file it hands over must be on."""
    account = request["account"]
    if str(request["op"]).startswith(OUTPUTS_PREFIX):
        owner = job_folder_owner(settings, account, request.get("job_id"))
        if owner is None:
            return None
        tenant, folder, device = owner
        return tenant, output_dir(folder), device
    if not settings.storage_root:
        raise ConfigError("this site has no account storage (storage_root is empty)")
    root = account_storage_dir(settings.storage_root, account)
    return lookup_tenant(settings, account), root, os.stat(root, follow_symlinks=False).st_dev


def handle_file_request(settings: Settings, request: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """Run one storage request as its account's tenant (or a job's outputs' owner): the answer, and the descriptors to send with it."""
    if os.geteuid() != 0:
        raise ConfigError("storage requests need root: set runas_socket to the gpupool run-as helper's socket")
    asked = agent_request(settings, request)
    where = _where(settings, request)
    if where is None:
        return {"ok": False, "error": "not_found", "message": "no such job"}, []
    tenant, asked["root"], device = where
    answer, fd = run_agent(settings, tenant.run_as(), asked)
    if answer.get("error") == "unavailable" and str(request["op"]).startswith(OUTPUTS_PREFIX):
        # The agent's word for a root it cannot open as its own: here, a job that made no output folder.
        answer = {"ok": False, "error": "not_found", "message": "the job has no output folder"}
    if fd is None:
        return answer, []
    try:
        if asked["op"] not in _WITH_DESCRIPTOR or answer.get("ok") is not True:
            raise TenantError("the storage agent sent a descriptor with an answer that takes none")
        check_descriptor(fd, device, pipe=asked["op"] == "tar")
    except BaseException:
        os.close(fd)
        raise
    return answer, [fd]
