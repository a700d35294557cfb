"""Read a job's log files so that nothing the job writes can steer or stall the read.

A job owns its folder and may replace ``stdout.log`` with anything: a symbolic
link to a secret, a FIFO that never answers, a hard link to another file, or a
gigabyte with no newline. So a log is opened only as the folder's own regular
file, owned by the tenant when its uid is known, without following a link at
the folder or the file, and without blocking; and every read is one bounded
``pread`` pass, at most ``max_bytes`` however large or line-less the file is.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

from gpupool.errors import LogUnavailable

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# O_PATH: the service may pass through a job's folder (0710) but not read it.
_FOLDER_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Tail reads go backwards this much at a time, so a short tail of a big log reads little.
_TAIL_CHUNK = 64 * 1024


def open_log(path: str, *, owner_uid: int | None) -> BinaryIO | None:
    """The log at ``path`` opened for reading, or None when it does not exist (yet).

    Raises LogUnavailable when the folder or the file is a symbolic link, the
    file is not a regular file, ``owner_uid`` is given and does not own it, or
    the service may not open it.
    """
    folder, name = os.path.split(path)
    try:
        folder_fd = os.open(folder or ".", _FOLDER_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refusal(path, exc, "its job folder is a symbolic link or not a folder") from exc
    try:
        try:
            fd = os.open(name, _OPEN_FLAGS, dir_fd=folder_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _refusal(path, exc, "it is a symbolic link") from exc
    finally:
        os.close(folder_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LogUnavailable(f"the job's log {os.path.basename(path)} is not a regular file; it cannot be served")
        if owner_uid is not None and info.st_uid != owner_uid:
            raise LogUnavailable(
                f"the job's log {os.path.basename(path)} is not owned by the account's user; it cannot be served"
            )
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def _refusal(path: str, exc: OSError, link_reason: str) -> LogUnavailable:
    # O_NOFOLLOW answers ELOOP for a link (ENOTDIR, with O_DIRECTORY, on some kernels).
    reason = link_reason if exc.errno in (errno.ELOOP, errno.ENOTDIR) else f"it cannot be opened ({exc.strerror})"
    return LogUnavailable(f"the job's log {os.path.basename(path)} is not served: {reason}")


def _pread_exactly(fd: int, size: int, offset: int) -> bytes:
    """Up to ``size`` bytes at ``offset``; fewer only at end of file."""
    parts: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        parts.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


def read_tail(handle: BinaryIO, lines: int, max_bytes: int) -> bytes:
    """The last ``lines`` lines, cut to their last ``max_bytes`` bytes when longer.

    A final newline ends the last line rather than starting an empty one. The
    file is read backwards, at most ``max_bytes`` in all, so the cost follows
    the answer's size, not the file's.
    """
    fd = handle.fileno()
    position = os.fstat(fd).st_size
    chunks: list[bytes] = []
    collected = newlines = 0
    # The newline before the first wanted line, plus the file's own final one if it has one.
    needed = lines
    while position > 0 and collected < max_bytes:
        step = min(_TAIL_CHUNK, position, max_bytes - collected)
        position -= step
        chunk = _pread_exactly(fd, step, position)
        if not chunks and chunk.endswith(b"\n"):
            needed += 1
        chunks.append(chunk)
        collected += len(chunk)
        newlines += chunk.count(b"\n")
        if newlines >= needed:
            break
    data = b"".join(reversed(chunks))
    cut = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return data
    return data[cut + 1 :]


def read_from(handle: BinaryIO, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """Up to ``max_bytes`` from ``offset`` and the offset after them.

    Past the end of the file this is empty and the offset is unchanged. The
    bytes may end inside a multi-byte UTF-8 character; the next read from the
    returned offset carries the rest.
    """
    data = _pread_exactly(handle.fileno(), max_bytes, offset)
    return data, offset + len(data)


def log_size(handle: BinaryIO) -> int:
    """The open log's size now; read after the bytes, it tells whether they reached the end."""
    return os.fstat(handle.fileno()).st_size
