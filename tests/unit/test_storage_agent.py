"""The storage agent's rules on a real folder: no link followed, no name outside, one upload per path, pages.

Run in-process here (as whoever runs the tests, who owns the folder), once
more under the host's python3 -I -S as the run-as helper starts it, with the
descriptor passed back over a socket pair. The same agent as the tenant, under
the helper, is tests/live/test_storage.py.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.storage import agent
from gpupool.storage.broker import AGENT_SOURCE
from gpupool.storage.paths import parse_path, upload_key


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both ways of resolving beneath the root: openat2, and the O_NOFOLLOW walk of kernels before 5.6."""
    monkeypatch.setattr(agent, "_openat2_missing", request.param == "walk")
    yield request.param


@pytest.fixture
def root(tmp_path: Path) -> Path:
    top = tmp_path / "acme"
    (top / "data").mkdir(parents=True)
    (top / "data" / "file.txt").write_bytes(b"mine")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"not yours")
    (top / "data" / "to-secret").symlink_to(tmp_path / "outside" / "secret")
    (top / "data" / "to-outside").symlink_to(tmp_path / "outside")
    (top / "up").symlink_to("..")
    return top


def ask(root: Path, op: str, path: str = "", **fields: Any) -> tuple[dict[str, Any], int | None]:
    request = {"op": op, "root": str(root), "path": list(parse_path(path).parts), **fields}
    try:
        return agent.handle(request)
    except agent.AgentError as exc:
        return {"ok": False, "error": exc.code}, None
    except OSError as exc:
        return agent.error_answer(exc), None


def test_a_file_is_opened_and_a_link_anywhere_on_the_path_is_not(root: Path, resolver: str) -> None:
    answer, fd = ask(root, "get", "data/file.txt")
    assert answer["type"] == "file" and fd is not None
    assert os.read(fd, 10) == b"mine"
    os.close(fd)
    for planted in ("data/to-secret", "data/to-outside/secret", "up/outside/secret", "up/acme/data/file.txt"):
        answer, fd = ask(root, "get", planted)
        assert (answer["ok"], answer["error"], fd) == (False, "not_found", None), planted
    with pytest.raises(agent.AgentError):
        agent.handle({"op": "get", "root": str(root), "path": ["..", "outside", "secret"]})


def test_a_listing_shows_links_as_links_page_by_page(root: Path, resolver: str) -> None:
    for n in range(25):
        (root / "data" / f"f{n:02}").write_bytes(b"x" * n)
    os.mkdir(root / agent.UPLOADS_DIR)
    names: list[str] = []
    after = None
    while True:
        answer, fd = ask(root, "get", "data/", limit=10, **({"after": after} if after else {}))
        assert fd is None and len(answer["entries"]) <= 10
        names += [entry["name"] for entry in answer["entries"]]
        after = answer["next_after"]
        if after is None:
            break
    assert names == sorted([f"f{n:02}" for n in range(25)] + ["file.txt", "to-outside", "to-secret"])
    kinds = {entry["name"]: entry["type"] for entry in ask(root, "get", "data/", limit=100)[0]["entries"]}
    assert (kinds["to-secret"], kinds["to-outside"], kinds["f03"]) == ("link", "link", "file")
    top = [entry["name"] for entry in ask(root, "get", "", limit=100)[0]["entries"]]
    assert top == ["data", "up"]  # uploads in progress are not listed


def test_one_upload_of_a_path_at_a_time_and_the_commit_renames_it(root: Path, resolver: str) -> None:
    key = upload_key(parse_path("new/deep/out.bin"))
    answer, fd = ask(root, "upload", "new/deep/out.bin", upload_key=key)
    assert answer["upload_offset"] == 0 and fd is not None
    os.write(fd, b"hello")
    assert ask(root, "upload", "new/deep/out.bin", upload_key=key)[0]["error"] == "busy"
    assert ask(root, "get", "new/deep/out.bin")[0]["error"] == "not_found"
    info = os.fstat(fd)
    committed, _ = ask(root, "commit", "new/deep/out.bin", upload_key=key, ino=info.st_ino, dev=info.st_dev)
    os.close(fd)
    assert committed["created"] and committed["size"] == 5
    assert (root / "new" / "deep" / "out.bin").read_bytes() == b"hello"
    assert ask(root, "upload", "data", upload_key=upload_key(parse_path("data")))[0]["error"] == "is_a_folder"
    assert ask(root, "upload", "data/file.txt/x", upload_key=upload_key(parse_path("data/file.txt/x")))[0]["error"] == "not_a_folder"


def test_deleting_a_folder_removes_links_not_what_they_point_to(root: Path, resolver: str, tmp_path: Path) -> None:
    assert ask(root, "delete", "data")[0]["error"] == "folder_not_empty"
    assert ask(root, "delete", "data", recursive=True)[0]["ok"]
    assert not (root / "data").exists()
    assert (tmp_path / "outside" / "secret").read_bytes() == b"not yours"
    assert ask(root, "delete", "data")[0]["error"] == "not_found"


def test_a_move_never_replaces_unless_told(root: Path, resolver: str) -> None:
    (root / "data" / "other.txt").write_bytes(b"other")
    assert ask(root, "move", "data/file.txt", target=["data", "other.txt"])[0]["error"] == "exists"
    assert ask(root, "move", "data/file.txt", target=["data", "other.txt"], overwrite=True)[0]["ok"]
    assert (root / "data" / "other.txt").read_bytes() == b"mine"
    assert ask(root, "move", "data", target=["data", "inside"])[0]["error"] == "refused"


def test_the_agent_runs_under_the_hosts_python_and_hands_over_a_descriptor(root: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours:
        process = subprocess.Popen(
            ["/usr/bin/python3", "-I", "-S", "-c", AGENT_SOURCE, str(theirs.fileno())], pass_fds=[theirs.fileno()],
            env={"PATH": "/usr/bin:/bin"},
        )
        theirs.close()
        ours.sendall(json.dumps({"op": "get", "root": str(root), "path": ["data", "file.txt"]}).encode() + b"\n")
        data, fds, _, _ = socket.recv_fds(ours, 65536, 1)
        assert process.wait(timeout=30) == 0
    assert json.loads(data)["size"] == 4 and len(fds) == 1
    assert os.read(fds[0], 10) == b"mine"
    os.close(fds[0])


def test_errors_are_answers() -> None:
    assert agent.error_answer(OSError(errno.ENOSPC, "full"))["error"] == "no_space"
    assert agent.error_answer(OSError(errno.EDQUOT, "quota"))["error"] == "no_space"
    assert agent.error_answer(OSError(errno.ELOOP, "link"))["error"] == "not_found"
    assert agent.error_answer(OSError(errno.EIO, "io"))["error"] == "io_error"
