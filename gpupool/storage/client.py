"""The service's side of storage: requests to the run-as helper, answers as gpupool errors, descriptors received.

The service never opens a tenant's file itself: it asks the helper
(``gpupool.storage.broker``), which has the account's own Unix user open it,
and receives the open descriptor over the helper's socket. What it then does
with the descriptor (read, write, sendfile, fstat) needs no path and no right
of its own on the account's files.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from gpupool.config import Settings
from gpupool.errors import (
    BadRequest,
    CommandTimedOut,
    Conflict,
    GpupoolError,
    NotFound,
    RunasUnavailable,
    StorageQuotaExceeded,
    StorageUnavailable,
    TenantError,
)
from gpupool.storage.broker import MAX_ANSWER_BYTES, OUTPUTS_PREFIX, PREFIX, handle_file_request
from gpupool.storage.paths import StoragePath, upload_key

# The agent's answers that are not the caller's error (gpupool.storage.agent), as the API says them.
_CONFLICTS = {
    "not_a_folder": "a file or a link is in the way: {path} is not in a folder",
    "is_a_folder": "{path} is a folder",
    "folder_not_empty": "{path} is a folder that is not empty; delete it with recursive=true",
    "exists": "{target} exists; move with overwrite=true to replace it",
    "busy": "another upload of {path} is in progress; wait for it to end, or resume it once it has",
    "upload_lost": "the upload of {path} was removed or replaced while it was being sent; send it again",
}


@dataclass
class Answer:
    """The agent's answer and the descriptor it opened, if any (the receiver closes it)."""

    facts: dict[str, Any]
    fd: int | None = None
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        if self.fd is not None and not self._closed:
            os.close(self.fd)
            self._closed = True

    def take_fd(self) -> int:
        """The descriptor, now the caller's to close."""
        assert self.fd is not None
        self._closed = True
        return self.fd


def _error(answer: dict[str, Any], path: StoragePath, target: StoragePath | None) -> GpupoolError:
    code = answer.get("error")
    shown = path.text or "/"
    if code == "not_found":
        missing = NotFound(f"no such file or folder: {shown}")
        if isinstance(answer.get("upload_offset"), int):
            missing.details["offset"] = answer["upload_offset"]  # what HEAD says of an interrupted upload
        return missing
    if code in _CONFLICTS:
        message = _CONFLICTS[code].format(path=shown, target=target.text if target else "")
        return Conflict(message, code={"busy": "upload_in_progress", "exists": "already_exists"}.get(code, code))
    if code == "no_space":
        return StorageQuotaExceeded("your storage is full: its quota is reached; delete files or ask the operator for more")
    if code == "refused":
        return BadRequest(str(answer.get("message") or "the path was refused"), code="path_invalid")
    if code == "unavailable":
        return StorageUnavailable("this account's storage is not set up on this host; ask the operator (gpupool storage sync)")
    return StorageUnavailable(f"the account's storage failed: {answer.get('message') or code}")


class StorageClient:
    """An account's files, each request run by the run-as helper as the account's Unix user."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def _send(self, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        if not self.settings.runas_socket:
            # Root in-process (the operator's shell, a test): the broker itself.
            answer, opened = handle_file_request(self.settings, request)
            return answer, (opened[0] if opened else None)
        timeout = self.settings.storage_op_timeout_s + self.settings.runas_timeout_s
        fds: list[int] = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(timeout)
                try:
                    conn.connect(self.settings.runas_socket)
                except OSError as exc:
                    raise RunasUnavailable(
                        f"the gpupool run-as helper is not answering on {self.settings.runas_socket}: {exc.strerror or exc}"
                    ) from exc
                conn.sendall(json.dumps(request).encode() + b"\n")
                received = bytearray()
                while b"\n" not in received:
                    data, new_fds, flags, _ = socket.recv_fds(conn, 65536, 1)
                    fds += new_fds
                    if flags & socket.MSG_CTRUNC or len(fds) > 1:
                        raise TenantError("the run-as helper sent more descriptors than one")
                    if not data:
                        break
                    received += data
                    if len(received) > MAX_ANSWER_BYTES:
                        raise TenantError("the run-as helper's answer is too large")
            answer = json.loads(bytes(received).split(b"\n", 1)[0])
            if not isinstance(answer, dict):
                raise ValueError("not an object")
        except TimeoutError as exc:
            self._close(fds)
            raise CommandTimedOut([str(request.get("op"))], timeout, "the run-as helper did not answer") from exc
        except (OSError, ValueError) as exc:
            self._close(fds)
            raise StorageUnavailable(f"the run-as helper's storage answer was lost: {exc}") from exc
        except BaseException:
            self._close(fds)
            raise
        if answer.get("outcome") == "busy":
            self._close(fds)
            raise RunasUnavailable(str(answer.get("message")))
        if answer.get("outcome") is not None:  # the helper's own refusal or failure, before any agent ran
            self._close(fds)
            raise TenantError(f"the run-as helper refused: {answer.get('message')}")
        return answer, (fds[0] if fds else None)

    @staticmethod
    def _close(fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)

    def _call(
        self, op: str, account: str, path: StoragePath, *, target: StoragePath | None = None, prefix: str = PREFIX, **fields: Any
    ) -> Answer:
        request: dict[str, Any] = {"op": prefix + op, "account": account, "path": "/".join(path.parts)}
        if target is not None:
            request["target"] = "/".join(target.parts)
        request.update({name: value for name, value in fields.items() if value is not None})
        answer, fd = self._send(request)
        if answer.get("ok") is not True:
            if fd is not None:
                os.close(fd)
            raise _error(answer, path, target)
        return Answer(answer, fd)

    def get(self, account: str, path: StoragePath, *, limit: int = 1000, after: str | None = None, upload_offset: bool = False) -> Answer:
        """A file opened for reading (``fd``), or a page of a folder's listing (``facts["entries"]``)."""
        key = upload_key(path) if upload_offset and path.parts and not path.folder else None
        return self._call("get", account, path, folder=path.folder or None, limit=limit, after=after, upload_key=key)

    def upload(self, account: str, path: StoragePath) -> Answer:
        """The path's upload in progress, open for writing and locked: ``fd``, and ``facts["upload_offset"]`` bytes so far."""
        return self._call("upload", account, path, upload_key=upload_key(path))

    def commit(self, account: str, path: StoragePath, ino: int, dev: int) -> dict[str, Any]:
        return self._call("commit", account, path, upload_key=upload_key(path), ino=ino, dev=dev).facts

    def abort(self, account: str, path: StoragePath, ino: int | None = None) -> None:
        self._call("abort", account, path, upload_key=upload_key(path), ino=ino)

    def delete(self, account: str, path: StoragePath, *, recursive: bool = False) -> None:
        self._call("delete", account, path, upload_key=upload_key(path), recursive=recursive or None)

    def move(self, account: str, path: StoragePath, target: StoragePath, *, overwrite: bool = False) -> dict[str, Any]:
        return self._call("move", account, path, target=target, overwrite=overwrite or None).facts

    def mkdir(self, account: str, path: StoragePath) -> dict[str, Any]:
        return self._call("mkdir", account, path).facts

    def output_get(self, account: str, job_id: str, path: StoragePath, *, limit: int = 1000, after: str | None = None) -> Answer:
        """A file of the job's output folder opened for reading (``fd``), or a page of one of its folders, as the job's user."""
        return self._call("get", account, path, prefix=OUTPUTS_PREFIX, job_id=job_id, folder=path.folder or None, limit=limit, after=after)

    def output_tar(self, account: str, job_id: str) -> Answer:
        """The job's output folder as a tar stream: ``fd`` is a pipe's read end, written by a process of the job's user."""
        return self._call("tar", account, StoragePath((), True), prefix=OUTPUTS_PREFIX, job_id=job_id)
