"""gpupool.joblogs on real files: what a job can plant where its log belongs, and bounded reads."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.errors import Conflict, LogUnavailable
from gpupool.joblogs import log_size, open_log, read_from, read_tail

MIB = 1024 * 1024
SECRET = b"root:$6$not-for-customers:19000:0:99999:7:::\n"
OTHER_UID = 54321


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "acme" / "job-1"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "shadow"
    path.write_bytes(SECRET)
    return path


def write_log(job_dir: Path, content: bytes) -> str:
    path = job_dir / "stdout.log"
    path.write_bytes(content)
    return str(path)


def tail(path: str, lines: int, max_bytes: int = MIB) -> bytes:
    handle = open_log(path, owner_uid=None)
    assert handle is not None
    with handle:
        return read_tail(handle, lines, max_bytes)


def bytes_read_by_this_process() -> int:
    """The kernel's count of bytes this process has read (``rchar``), to bound a read without mocks."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar")


# --- what open_log refuses --------------------------------------------------------------


def test_missing_file_or_folder_is_none(job_dir: Path) -> None:
    assert open_log(str(job_dir / "stdout.log"), owner_uid=None) is None
    assert open_log(str(job_dir / "not-yet" / "stdout.log"), owner_uid=None) is None


def test_symlink_to_a_secret_is_refused(job_dir: Path, secret: Path) -> None:
    (job_dir / "stdout.log").symlink_to(secret)
    with pytest.raises(LogUnavailable) as info:
        open_log(str(job_dir / "stdout.log"), owner_uid=None)
    assert isinstance(info.value, Conflict)  # served as 409
    assert info.value.code == "log_unavailable"
    assert info.value.message == "the job's log stdout.log is not served: it is a symbolic link"
    assert SECRET.decode() not in info.value.message


def test_dangling_symlink_is_refused_not_missing(job_dir: Path) -> None:
    (job_dir / "stdout.log").symlink_to(job_dir / "absent")
    with pytest.raises(LogUnavailable, match="symbolic link"):
        open_log(str(job_dir / "stdout.log"), owner_uid=None)


def test_symlinked_job_folder_is_refused(tmp_path: Path, secret: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "stdout.log").symlink_to(secret)
    (tmp_path / "elsewhere" / "stderr.log").write_bytes(SECRET)
    (tmp_path / "job-2").symlink_to(tmp_path / "elsewhere")
    for stream in ("stdout", "stderr"):
        with pytest.raises(LogUnavailable) as info:
            open_log(str(tmp_path / "job-2" / f"{stream}.log"), owner_uid=None)
        assert info.value.message == (
            f"the job's log {stream}.log is not served: its job folder is a symbolic link or not a folder"
        )


def test_fifo_is_refused_without_blocking(job_dir: Path) -> None:
    fifo = job_dir / "stdout.log"
    os.mkfifo(fifo)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        opening = pool.submit(open_log, str(fifo), owner_uid=None)
        try:
            # Generous: this is a guard against hanging the suite, not a measure of speed.
            error = opening.exception(timeout=60)
        except concurrent.futures.TimeoutError:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # release the blocked open
            pytest.fail("open_log blocked on a FIFO with no writer")
    assert isinstance(error, LogUnavailable)
    assert error.message == "the job's log stdout.log is not a regular file; it cannot be served"


def test_directory_is_refused(job_dir: Path) -> None:
    (job_dir / "stdout.log").mkdir()
    with pytest.raises(LogUnavailable, match="not a regular file"):
        open_log(str(job_dir / "stdout.log"), owner_uid=None)


def test_file_of_another_owner_is_refused(job_dir: Path) -> None:
    path = write_log(job_dir, b"hello\n")
    os.chown(path, OTHER_UID, -1)
    with pytest.raises(LogUnavailable) as info:
        open_log(path, owner_uid=os.getuid())
    assert info.value.message == "the job's log stdout.log is not owned by the account's user; it cannot be served"
    handle = open_log(path, owner_uid=OTHER_UID)
    assert handle is not None
    with handle:
        assert read_tail(handle, 10, MIB) == b"hello\n"


def test_owner_unchecked_without_a_uid(job_dir: Path) -> None:
    path = write_log(job_dir, b"x\n")
    os.chown(path, OTHER_UID, -1)
    handle = open_log(path, owner_uid=None)
    assert handle is not None
    handle.close()


# --- tails ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "lines", "expected"),
    [
        (b"a\nb\nc\n", 1, b"c\n"),
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\n", 3, b"a\nb\nc\n"),
        (b"a\nb\nc\n", 100, b"a\nb\nc\n"),
        (b"a\nb\nc", 1, b"c"),
        (b"a\nb\nc", 2, b"b\nc"),
        (b"a\n\n", 1, b"\n"),
        (b"\n", 1, b"\n"),
        (b"no newline at all", 5, b"no newline at all"),
        (b"", 1, b""),
    ],
)
def test_tail_lines(job_dir: Path, content: bytes, lines: int, expected: bytes) -> None:
    assert tail(write_log(job_dir, content), lines) == expected


def test_tail_crosses_read_chunks(job_dir: Path) -> None:
    rows = [f"line {i:06d} {'x' * 90}\n".encode() for i in range(5000)]  # ~500 KB, several 64 KiB chunks
    path = write_log(job_dir, b"".join(rows))
    assert tail(path, 1000) == b"".join(rows[-1000:])
    assert tail(path, 5000) == b"".join(rows)


def test_tail_is_cut_to_max_bytes(job_dir: Path) -> None:
    path = write_log(job_dir, b"first\n" + b"y" * 300 + b"\nlast\n")
    assert tail(path, 3, max_bytes=100) == (b"y" * 300 + b"\nlast\n")[-100:]


def test_tail_of_a_64_mib_line_reads_at_most_max_bytes(job_dir: Path) -> None:
    path = write_log(job_dir, b"z" * (64 * MIB))
    handle = open_log(path, owner_uid=None)
    assert handle is not None
    with handle:
        before = bytes_read_by_this_process()
        content = read_tail(handle, 1, MIB)
        read = bytes_read_by_this_process() - before
    assert content == b"z" * MIB
    assert MIB <= read < MIB + 1024  # the megabyte returned, plus the read of /proc/self/io


def test_short_tail_of_a_big_log_reads_little(job_dir: Path) -> None:
    path = write_log(job_dir, b"short line\n" * (2 * MIB))  # 22 MiB
    handle = open_log(path, owner_uid=None)
    assert handle is not None
    with handle:
        before = bytes_read_by_this_process()
        content = read_tail(handle, 2, MIB)
        read = bytes_read_by_this_process() - before
    assert content == b"short line\nshort line\n"
    # One 64 KiB backwards chunk (plus the read of /proc/self/io), not the megabyte allowed.
    assert read < 65 * 1024


# --- offset reads -----------------------------------------------------------------------


def test_offset_reads_stitch_back_to_the_exact_file(job_dir: Path) -> None:
    content = "héllo wörld ✓ 🚀 日本\n".encode() * 50 + bytes(range(256))
    path = write_log(job_dir, content)
    handle = open_log(path, owner_uid=None)
    assert handle is not None
    pieces, offset = [], 0
    with handle:
        while True:
            piece, next_offset = read_from(handle, offset, 7)
            assert next_offset == offset + len(piece) and len(piece) <= 7
            if not piece:
                break
            pieces.append(piece)
            offset = next_offset
        assert offset == log_size(handle) == len(content)
    assert b"".join(pieces) == content


def test_offset_read_may_split_a_utf8_character(job_dir: Path) -> None:
    path = write_log(job_dir, "ab✓cd".encode())  # ✓ is 3 bytes, at offsets 2..4
    handle = open_log(path, owner_uid=None)
    assert handle is not None
    with handle:
        first, offset = read_from(handle, 0, 3)
        rest, end = read_from(handle, offset, 100)
    assert (first, offset) == (b"ab\xe2", 3)
    with pytest.raises(UnicodeDecodeError):
        first.decode()
    assert (first + rest).decode() == "ab✓cd" and end == 7


@pytest.mark.parametrize("offset", [5, 6, 10**12])
def test_offset_at_or_past_the_end_is_empty(job_dir: Path, offset: int) -> None:
    handle = open_log(write_log(job_dir, b"12345"), owner_uid=None)
    assert handle is not None
    with handle:
        assert read_from(handle, offset, MIB) == (b"", offset)


def test_offset_reads_see_a_growing_log(job_dir: Path) -> None:
    path = Path(write_log(job_dir, b"one\n"))
    handle = open_log(str(path), owner_uid=None)
    assert handle is not None
    with handle:
        first, offset = read_from(handle, 0, MIB)
        with path.open("ab") as writer:
            writer.write(b"two\n")
        second, end = read_from(handle, offset, MIB)
    assert (first, second, end) == (b"one\n", b"two\n", 8)


@pytest.fixture(autouse=True)
def _no_leaked_descriptors() -> Iterator[None]:
    before = set(os.listdir("/proc/self/fd"))
    yield
    leaked = set(os.listdir("/proc/self/fd")) - before
    assert not leaked, f"file descriptors left open: {sorted(leaked)}"
