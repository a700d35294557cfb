"""The one thing that touches an account's files: a short process running as the account's Unix user.

The run-as helper (root) starts it for each request with setpriv, as the
tenant, with no supplementary group (``gpupool.storage.broker``), and hands it
one end of a socket pair: a JSON request comes in, a JSON answer goes out,
with the open file's descriptor (SCM_RIGHTS) when the request opens one. So
every path is resolved, and every permission decided, by the kernel for the
tenant: never by root, never by the service.

Paths are resolved beneath the account's root with ``openat2`` and
RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
(Linux 5.6), or, where the kernel lacks it, name by name with O_NOFOLLOW from
the root's descriptor: a symbolic link anywhere on the path, ``..``, or another
filesystem ends the lookup. A link a job planted (to /etc/shadow, to another
account's file) is therefore never followed; it can be listed, moved and
deleted like any name, but not read through.

Stdlib only, and Python 3.9 or later: it runs under the host's own
``/usr/bin/python3`` (``storage_agent_python``) with ``-I -S``, from source the
helper passes on its command line, because the tenant may read nothing of
gpupool's own installation. It must not import gpupool.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import heapq
import json
import os
import re
import socket
import stat
import sys
import tarfile
from typing import Any

# gpupool.storage.paths, which this file cannot import.
UPLOADS_DIR = ".gpupool-uploads"
# Not listed at the top: uploads in progress, and the root-owned folder e2fsck keeps (the kernel refuses it anyway).
_HIDDEN_AT_ROOT = (UPLOADS_DIR, "lost+found")
MAX_NAME_BYTES = 255
MAX_REQUEST_BYTES = 1024 * 1024
_UPLOAD_KEY = re.compile(r"^[0-9a-f]{64}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# openat2(2): <linux/openat2.h>; the syscall's number is the same on every architecture (since 5.1).
SYS_OPENAT2 = 437
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE = RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH
RENAME_NOREPLACE = 1
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# What it asks for; the volume's default ACL (gpupool.storage.volumes) makes it the account group's
# too, and where there is none the umask (0077) keeps it the user's own.
FOLDER_MODE = 0o777
FILE_MODE = 0o666

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class AgentError(Exception):
    """An answer for the caller: ``code`` is what gpupool.storage.client maps to HTTP."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# Errors a path can meet on its way, each an answer rather than a crash.
_NOT_FOUND = (errno.ENOENT, errno.EACCES, errno.EPERM, errno.ELOOP, errno.EXDEV, errno.ENOTDIR)
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def error_answer(exc: OSError) -> dict[str, Any]:
    """The answer for an OSError that reached the top: the kernel's word, in the caller's terms."""
    err = exc.errno or 0
    if err in _NO_SPACE:
        code = "no_space"
    elif err in _NOT_FOUND:
        code = "not_found"
    elif err == errno.ENAMETOOLONG:
        code = "refused"
    elif err == errno.EBUSY:
        code = "busy"
    else:
        code = "io_error"
    return {"ok": False, "error": code, "errno": err, "message": os.strerror(err)}


def check_names(names: Any) -> list[str]:
    """The names of a path, each a plain name (gpupool.storage.paths.parse_path's rules, checked again here)."""
    if not isinstance(names, list):
        raise AgentError("refused", "a path is a list of names")
    for name in names:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or _CONTROL.search(name):
            raise AgentError("refused", "a path holds only plain names: no '/', '.', '..', empty names or control characters")
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise AgentError("refused", f"a name is at most {MAX_NAME_BYTES} bytes")
    if names and names[0] == UPLOADS_DIR:
        raise AgentError("refused", f"{UPLOADS_DIR} holds uploads in progress and cannot be named")
    return names


_openat2_missing = False


def open_beneath(root_fd: int, names: list[str], flags: int, mode: int = 0) -> int:
    """``names`` opened relative to ``root_fd``, never through a symbolic link nor onto another filesystem."""
    if not names:
        return os.open(".", flags | os.O_CLOEXEC, dir_fd=root_fd)
    global _openat2_missing
    if not _openat2_missing:
        how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, RESOLVE)
        path = "/".join(names).encode("utf-8")
        fd = _libc.syscall(
            ctypes.c_long(SYS_OPENAT2), ctypes.c_int(root_fd), ctypes.c_char_p(path), ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise OSError(err, os.strerror(err), "/".join(names))
        _openat2_missing = True  # before Linux 5.6: the same rules, one name at a time
    return _open_walking(root_fd, names, flags, mode)


def _open_walking(root_fd: int, names: list[str], flags: int, mode: int) -> int:
    device = os.fstat(root_fd).st_dev
    current = os.open(".", DIR_FLAGS, dir_fd=root_fd)
    try:
        for name in names[:-1]:
            step = os.open(name, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=current)
            os.close(current)
            current = step
            if os.fstat(current).st_dev != device:
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), name)
        fd = os.open(names[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=current)
        if os.fstat(fd).st_dev != device:
            os.close(fd)
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), names[-1])
        return fd
    finally:
        os.close(current)


def make_folders(root_fd: int, names: list[str]) -> int:
    """The folder ``names`` (and those above it) made where missing, never through a link; its descriptor."""
    device = os.fstat(root_fd).st_dev
    current = os.open(".", DIR_FLAGS, dir_fd=root_fd)
    try:
        for name in names:
            try:
                os.mkdir(name, FOLDER_MODE, dir_fd=current)
            except FileExistsError:
                pass
            try:
                step = os.open(name, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=current)
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise AgentError("not_a_folder", f"{name} is in the way: a file or a link, not a folder") from None
                raise
            os.close(current)
            current = step
            if os.fstat(current).st_dev != device:
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), name)
        result, current = current, -1
        return result
    finally:
        if current >= 0:
            os.close(current)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def _file_facts(info: os.stat_result) -> dict[str, Any]:
    return {"type": _kind(info.st_mode), "size": info.st_size, "mtime_ns": info.st_mtime_ns, "ino": info.st_ino, "dev": info.st_dev}


def _parent(root_fd: int, names: list[str]) -> int:
    """The folder holding the last name of ``names``."""
    return open_beneath(root_fd, names[:-1], DIR_FLAGS)


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def upload_offset(root_fd: int, key: str) -> int:
    """Bytes stored so far by an interrupted upload under ``key``; 0 when there is none."""
    try:
        uploads = open_beneath(root_fd, [UPLOADS_DIR], DIR_FLAGS)
    except OSError:
        return 0
    try:
        info = _lstat(uploads, key)
        return info.st_size if info is not None and stat.S_ISREG(info.st_mode) else 0
    finally:
        os.close(uploads)


def list_folder(dir_fd: int, limit: int, after: str | None, at_root: bool) -> dict[str, Any]:
    """One page of a folder's names in code point order, after ``after``; constant memory in the page size.

    Each entry is described as itself (a link is a link, never its target).
    Names that are not UTF-8 cannot be named through the API: counted, not listed.
    """
    skipped = 0

    def names() -> Any:
        nonlocal skipped
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                name = entry.name
                if at_root and name in _HIDDEN_AT_ROOT:
                    continue
                try:
                    name.encode("utf-8")
                except UnicodeEncodeError:
                    skipped += 1
                    continue
                if after is None or name > after:
                    yield name

    page = heapq.nsmallest(limit + 1, names())
    more = len(page) > limit
    listed = []
    for name in page[:limit]:
        info = _lstat(dir_fd, name)
        if info is None:
            continue  # removed since the scan
        kind = _kind(info.st_mode)
        listed.append({"name": name, "type": kind, "size": info.st_size if kind == "file" else None, "mtime_ns": info.st_mtime_ns})
    return {"entries": listed, "next_after": page[limit - 1] if more and limit > 0 else None, "skipped": skipped}


def op_get(root_fd: int, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """A file opened for reading (its descriptor), or a folder's listing."""
    names = check_names(request.get("path"))
    answer: dict[str, Any] = {"ok": True}
    key = request.get("upload_key")
    if isinstance(key, str) and _UPLOAD_KEY.match(key):
        answer["upload_offset"] = upload_offset(root_fd, key)
    try:
        # O_NONBLOCK: a FIFO a job left here must not hold the request open; it is refused below.
        fd = open_beneath(root_fd, names, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in _NOT_FOUND:
            answer.update(ok=False, error="not_found", errno=exc.errno, message=os.strerror(exc.errno or 0))
            return answer, None
        raise
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        try:
            limit = max(0, min(int(request.get("limit", 1000)), 10000))
            after = request.get("after")
            answer.update(_file_facts(info))
            answer.update(list_folder(fd, limit, after if isinstance(after, str) else None, not names))
        finally:
            os.close(fd)
        return answer, None
    if not stat.S_ISREG(info.st_mode) or request.get("folder"):
        os.close(fd)
        if stat.S_ISREG(info.st_mode):
            raise AgentError("not_a_folder", "this is a file, not a folder")
        raise AgentError("not_found", "neither a file nor a folder")
    os.set_blocking(fd, True)
    answer.update(_file_facts(info))
    return answer, fd


def _check_target(root_fd: int, names: list[str]) -> None:
    """Refuse an upload whose folders are files, or whose name is a folder, before a byte is sent."""
    try:
        parent = _parent(root_fd, names)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return  # folders made at the commit
        if exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.EXDEV):
            raise AgentError("not_a_folder", "a file or a link is in the way of the folders of this path") from None
        raise
    try:
        info = _lstat(parent, names[-1])
    finally:
        os.close(parent)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise AgentError("is_a_folder", "a folder has this name")


def _uploads(root_fd: int) -> int:
    return make_folders(root_fd, [UPLOADS_DIR])


def op_upload(root_fd: int, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The upload in progress for a path, opened read-write and locked: its descriptor and how many bytes it holds.

    One upload per path at a time: the descriptor carries an exclusive flock,
    held for as long as the caller keeps it open; another gets ``busy``.
    """
    names = check_names(request.get("path"))
    key = request.get("upload_key")
    if not names or not isinstance(key, str) or not _UPLOAD_KEY.match(key):
        raise AgentError("refused", "an upload names a file and its upload key")
    _check_target(root_fd, names)
    uploads = _uploads(root_fd)
    try:
        fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, FILE_MODE, dir_fd=uploads)
    finally:
        os.close(uploads)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise AgentError("busy", "the upload's temporary name is taken by something else; delete the path and retry")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AgentError("busy", "another upload of this path is in progress") from None
    os.set_blocking(fd, True)
    return {"ok": True, "upload_offset": info.st_size, "ino": info.st_ino, "dev": info.st_dev}, fd


def op_commit(root_fd: int, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """Rename a finished upload to its path, making its folders: a reader sees the old file or the whole new one."""
    names = check_names(request.get("path"))
    key, ino, dev = request.get("upload_key"), request.get("ino"), request.get("dev")
    if not names or not isinstance(key, str) or not _UPLOAD_KEY.match(key) or not isinstance(ino, int) or not isinstance(dev, int):
        raise AgentError("refused", "a commit names a file, its upload key and the upload's inode")
    uploads = open_beneath(root_fd, [UPLOADS_DIR], DIR_FLAGS)
    try:
        info = _lstat(uploads, key)
        if info is None or not stat.S_ISREG(info.st_mode) or (info.st_ino, info.st_dev) != (ino, dev):
            raise AgentError("upload_lost", "the upload was removed or replaced while it was being sent")
        parent = make_folders(root_fd, names[:-1])
        try:
            existing = _lstat(parent, names[-1])
            if existing is not None and stat.S_ISDIR(existing.st_mode):
                raise AgentError("is_a_folder", "a folder has this name")
            # rename(2) replaces the last name itself, never what a link there points to.
            os.rename(key, names[-1], src_dir_fd=uploads, dst_dir_fd=parent)
            final = os.stat(names[-1], dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)
    finally:
        os.close(uploads)
    answer = {"ok": True, "created": existing is None}
    answer.update(_file_facts(final))
    return answer, None


def op_abort(root_fd: int, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """Remove an upload in progress (the one with ``ino`` only, when given): its bytes are gone."""
    key, ino = request.get("upload_key"), request.get("ino")
    if not isinstance(key, str) or not _UPLOAD_KEY.match(key):
        raise AgentError("refused", "an abort names the upload key")
    try:
        uploads = open_beneath(root_fd, [UPLOADS_DIR], DIR_FLAGS)
    except FileNotFoundError:
        return {"ok": True, "removed": False}, None
    try:
        info = _lstat(uploads, key)
        if info is None or (isinstance(ino, int) and info.st_ino != ino):
            return {"ok": True, "removed": False}, None
        os.unlink(key, dir_fd=uploads)
        return {"ok": True, "removed": True}, None
    finally:
        os.close(uploads)


def _remove_tree(parent: int, name: str) -> None:
    """A folder and everything in it, by descriptors: a link inside is removed, never followed."""
    fd = os.open(name, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
    try:
        with os.scandir(fd) as entries:
            children = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
        for child, is_dir in children:
            if is_dir:
                _remove_tree(fd, child)
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def op_delete(root_fd: int, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """Delete a file, a link, an empty folder (or, with ``recursive``, any folder), and the path's upload in progress."""
    names = check_names(request.get("path"))
    if not names:
        raise AgentError("refused", "the top of your storage cannot be deleted")
    removed = False
    try:
        parent = _parent(root_fd, names)
    except OSError as exc:
        if exc.errno not in _NOT_FOUND:
            raise
        parent = -1
    if parent >= 0:
        try:
            info = _lstat(parent, names[-1])
            if info is not None and stat.S_ISDIR(info.st_mode):
                if request.get("recursive") is True:
                    _remove_tree(parent, names[-1])
                else:
                    try:
                        os.rmdir(names[-1], dir_fd=parent)
                    except OSError as exc:
                        if exc.errno == errno.ENOTEMPTY:
                            raise AgentError("folder_not_empty", "the folder is not empty; delete with recursive=true") from None
                        raise
                removed = True
            elif info is not None:
                os.unlink(names[-1], dir_fd=parent)
                removed = True
        finally:
            os.close(parent)
    key = request.get("upload_key")
    if isinstance(key, str) and _UPLOAD_KEY.match(key):
        removed = op_abort(root_fd, {"upload_key": key})[0]["removed"] or removed
    if not removed:
        raise AgentError("not_found", "no such file or folder")
    return {"ok": True}, None


def _renameat2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    result = _libc.renameat2(
        ctypes.c_int(src_dir), ctypes.c_char_p(src.encode("utf-8")), ctypes.c_int(dst_dir),
        ctypes.c_char_p(dst.encode("utf-8")), ctypes.c_uint(flags),
    )
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


def op_move(root_fd: int, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """Rename a file, link or folder within the account's storage; an existing target only with ``overwrite``."""
    source = check_names(request.get("path"))
    target = check_names(request.get("target"))
    if not source or not target:
        raise AgentError("refused", "a move names a file or folder, and where it goes")
    try:
        source_parent = _parent(root_fd, source)
    except OSError as exc:
        if exc.errno in _NOT_FOUND:
            raise AgentError("not_found", "no such file or folder") from None
        raise
    try:
        if _lstat(source_parent, source[-1]) is None:
            raise AgentError("not_found", "no such file or folder")
        target_parent = make_folders(root_fd, target[:-1])
        try:
            try:
                if request.get("overwrite") is True:
                    os.rename(source[-1], target[-1], src_dir_fd=source_parent, dst_dir_fd=target_parent)
                else:
                    _renameat2(source_parent, source[-1], target_parent, target[-1], RENAME_NOREPLACE)
            except OSError as exc:
                if exc.errno == errno.EEXIST:
                    raise AgentError("exists", "the target exists; move with overwrite=true to replace it") from None
                if exc.errno in (errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY):
                    raise AgentError("is_a_folder", "a file and a folder cannot replace each other") from None
                if exc.errno == errno.EINVAL:
                    raise AgentError("refused", "a folder cannot move into itself") from None
                raise
            final = os.stat(target[-1], dir_fd=target_parent, follow_symlinks=False)
        finally:
            os.close(target_parent)
    finally:
        os.close(source_parent)
    answer: dict[str, Any] = {"ok": True}
    answer.update(_file_facts(final))
    return answer, None


def op_mkdir(root_fd: int, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """A folder (and those above it); ``created`` says whether it was new."""
    names = check_names(request.get("path"))
    if not names:
        raise AgentError("refused", "the top of your storage exists already")
    try:
        parent = _parent(root_fd, names)
        existed = _lstat(parent, names[-1]) is not None
        os.close(parent)
    except OSError:
        existed = False
    fd = make_folders(root_fd, names)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    answer: dict[str, Any] = {"ok": True, "created": not existed}
    answer.update(_file_facts(info))
    return answer, None


# What a tar stream that ended in the middle ends with: not the two zero blocks of a whole archive,
# so the reader (api.outputs) can tell a cut-off archive from a finished one.
TAR_BROKEN_END = b"\xff" * tarfile.BLOCKSIZE
TAR_CHUNK = 1024 * 1024


class _Exactly:
    """``size`` bytes of an open file for tarfile: cut where it grew since its header, zeros where it shrank."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd, self._left = fd, size

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        data = os.read(self._fd, size) if size > 0 else b""
        if size > 0 and not data:
            data = bytes(size)
        self._left -= len(data)
        return data


def _tar_info(name: str, info: os.stat_result) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.mode = stat.S_IMODE(info.st_mode)
    entry.mtime = int(info.st_mtime)
    return entry


def _tar_folder(archive: tarfile.TarFile, dir_fd: int, prefix: str, device: int, at_root: bool) -> None:
    """Each entry of a folder, by descriptor: a file's bytes, a link as a link (never followed), a folder's entries."""
    with os.scandir(dir_fd) as entries:
        names = sorted(entry.name for entry in entries if not (at_root and entry.name in _HIDDEN_AT_ROOT))
    for name in names:
        info = _lstat(dir_fd, name)
        if info is None:
            continue  # removed since the scan
        path = prefix + name
        if stat.S_ISLNK(info.st_mode):
            entry = _tar_info(path, info)
            entry.type, entry.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dir_fd)
            archive.addfile(entry)
        elif stat.S_ISDIR(info.st_mode):
            fd = os.open(name, DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
            try:
                if os.fstat(fd).st_dev != device:
                    continue  # another filesystem mounted here: not the job's
                entry = _tar_info(path, info)
                entry.type = tarfile.DIRTYPE
                archive.addfile(entry)
                _tar_folder(archive, fd, path + "/", device, False)
            finally:
                os.close(fd)
        elif stat.S_ISREG(info.st_mode):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno in _NOT_FOUND:
                    continue  # gone, replaced by a link, or unreadable to this user: left out
                raise
            try:
                opened = os.fstat(fd)
                if not stat.S_ISREG(opened.st_mode) or opened.st_dev != device:
                    continue
                entry = _tar_info(path, opened)
                entry.size = opened.st_size
                archive.addfile(entry, _Exactly(fd, opened.st_size))  # type: ignore[arg-type]
            finally:
                os.close(fd)
        # FIFOs, sockets and devices: nothing to take home.


def write_tar(root_fd: int, out_fd: int) -> None:
    """The whole folder as a tar stream ('w|': nothing seeks, nothing is held) on ``out_fd``; a broken end if it fails."""
    out = os.fdopen(out_fd, "wb", buffering=TAR_CHUNK)
    try:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as archive:
            _tar_folder(archive, root_fd, "", os.fstat(root_fd).st_dev, True)
        out.flush()
    except BrokenPipeError:
        pass  # the reader went away: nothing more to say
    except BaseException:
        try:
            out.write(TAR_BROKEN_END)
            out.flush()
        except OSError:
            pass
        raise
    finally:
        try:
            out.close()
        except OSError:
            pass  # what was left in the buffer had no reader


def _close_all_but(*kept: int) -> None:
    low = 3
    for fd in sorted(kept):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def op_tar(root_fd: int, request: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """A pipe's read end, and a child process of this one that writes the folder into it as a tar stream.

    The child writes on after this process has answered and exited, so the
    helper's wait for the agent is as short as for any request; it runs as the
    same user, and ends when the archive is written or its reader closes the pipe.
    """
    check_names(request.get("path"))
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the writer
        status = 1
        try:
            os.close(read_end)
            null = os.open(os.devnull, os.O_RDWR)
            for stream in (0, 1, 2):  # the helper reads the agent's stderr to its end: not held open by this child
                os.dup2(null, stream)
            _close_all_but(root_fd, write_end)  # the socket first: the answer is the parent's to send
            write_tar(root_fd, write_end)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    return {"ok": True, "type": "tar"}, read_end


OPERATIONS = {
    "get": op_get, "upload": op_upload, "commit": op_commit, "abort": op_abort,
    "delete": op_delete, "move": op_move, "mkdir": op_mkdir, "tar": op_tar,
}


def open_root(root: str) -> int:
    """The account's storage, which must be this user's own (its volume mounted): else ``unavailable``."""
    try:
        fd = os.open(root, DIR_FLAGS | os.O_NOFOLLOW)
    except OSError:
        raise AgentError("unavailable", "this account's storage is not set up on this host") from None
    if os.fstat(fd).st_uid != os.getuid():
        os.close(fd)
        raise AgentError("unavailable", "this account's storage is not set up on this host")
    return fd


def handle(request: Any) -> tuple[dict[str, Any], int | None]:
    if not isinstance(request, dict) or request.get("op") not in OPERATIONS or not isinstance(request.get("root"), str):
        raise AgentError("refused", "not a storage request")
    root_fd = open_root(request["root"])
    try:
        return OPERATIONS[request["op"]](root_fd, request)
    finally:
        os.close(root_fd)


def serve(sock: socket.socket) -> None:
    """One request in, one answer (and at most one descriptor) out."""
    received = b""
    while b"\n" not in received and len(received) <= MAX_REQUEST_BYTES:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    fd: int | None = None
    try:
        answer, fd = handle(json.loads(received.split(b"\n", 1)[0]))
    except AgentError as exc:
        answer = {"ok": False, "error": exc.code, "message": exc.message}
    except OSError as exc:
        answer = error_answer(exc)
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        answer = {"ok": False, "error": "refused", "message": f"{type(exc).__name__}: {exc}"}
    data = json.dumps(answer).encode("utf-8") + b"\n"
    if fd is None:
        sock.sendall(data)
        return
    try:
        sent = socket.send_fds(sock, [data], [fd])
        sock.sendall(data[sent:])
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    os.umask(0o077)
    with socket.socket(fileno=int(argv[1])) as sock:
        serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
