"""A job's output folder as a tar stream: written by the storage agent's child into a pipe, links kept as links.

The agent runs under the host's python3 -I -S as the run-as helper starts it
(as whoever runs the tests, who owns the folder); the same as a tenant, under
the helper and gunicorn, is tests/live/test_job_outputs.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpupool.storage import agent
from gpupool.storage.broker import AGENT_SOURCE
from gpupool.storage.tarstream import TarTail


@pytest.fixture
def output(tmp_path: Path) -> Path:
    top = tmp_path / "output"
    (top / "sub" / "deeper").mkdir(parents=True)
    (top / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 7))  # past a pipe's buffer: written after the agent exits
    (top / "sub" / "deeper" / "note.txt").write_bytes(b"hello")
    (tmp_path / "secret").write_bytes(b"not in the archive")
    (top / "sub" / "to-secret").symlink_to(tmp_path / "secret")
    os.mkfifo(top / "a-fifo")
    return top


def tar_over_socket(root: Path) -> tuple[dict[str, object], bytes]:
    ours, theirs = socket.socketpair()
    with ours:
        process = subprocess.Popen(
            ["/usr/bin/python3", "-I", "-S", "-c", AGENT_SOURCE, str(theirs.fileno())], pass_fds=[theirs.fileno()],
            env={"PATH": "/usr/bin:/bin"}, stderr=subprocess.PIPE,
        )
        theirs.close()
        ours.sendall(json.dumps({"op": "tar", "root": str(root), "path": []}).encode() + b"\n")
        data, fds, _, _ = socket.recv_fds(ours, 65536, 1)
        # The agent answers and exits at once; its child writes on into the pipe, and holds no stderr open.
        assert process.wait(timeout=30) == 0
        assert process.stderr is not None
        with process.stderr:
            assert process.stderr.read() == b""
    assert len(fds) == 1
    with os.fdopen(fds[0], "rb") as pipe:
        return json.loads(data), pipe.read()


def test_the_archive_has_files_folders_and_links_as_links(output: Path) -> None:
    answer, stream = tar_over_socket(output)
    assert answer == {"ok": True, "type": "tar"}
    tail = TarTail()
    tail.feed(stream)
    assert tail.complete()
    with tarfile.open(fileobj=io.BytesIO(stream), mode="r:") as archive:
        members = {member.name: member for member in archive.getmembers()}
        assert sorted(members) == ["big.bin", "sub", "sub/deeper", "sub/deeper/note.txt", "sub/to-secret"]
        big = archive.extractfile("big.bin")
        assert big is not None
        assert hashlib.sha256(big.read()).hexdigest() == hashlib.sha256((output / "big.bin").read_bytes()).hexdigest()
        link = members["sub/to-secret"]
        assert link.issym() and link.linkname == str(output.parent / "secret") and link.size == 0
        assert members["sub"].isdir()
    assert b"not in the archive" not in stream


def test_a_missing_root_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(agent.AgentError) as refused:
        agent.handle({"op": "tar", "root": str(tmp_path / "none"), "path": []})
    assert refused.value.code == "unavailable"


def test_a_writer_that_fails_ends_the_stream_as_no_whole_archive(output: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_args: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(agent, "_tar_folder", fail)
    read_end, write_end = os.pipe()
    root_fd = os.open(output, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError):
            agent.write_tar(root_fd, write_end)
    finally:
        os.close(root_fd)
    with os.fdopen(read_end, "rb") as pipe:
        stream = pipe.read()
    tail = TarTail()
    tail.feed(stream)
    assert stream.endswith(agent.TAR_BROKEN_END) and not tail.complete()


@pytest.mark.parametrize(
    ("chunks", "whole"),
    [
        ([bytes(10240)], True),
        ([b"x" * 512, bytes(512), bytes(512)], True),
        ([b"x" * 512, bytes(1023)], False),  # not whole blocks
        ([b"x" * 1024, b"\xff" * 512], False),
        ([bytes(512)], False),
        ([], False),
    ],
)
def test_the_tail_tells_a_whole_archive(chunks: list[bytes], whole: bool) -> None:
    tail = TarTail()
    for chunk in chunks:
        tail.feed(chunk)
    assert tail.complete() is whole
