"""The customers' tools for their storage: `gpupool-client cp`, `ls`, `rm`, and Client.upload/download, live.

Same bytes both ways (SHA-256), an upload cut off by a dying client continued
with `cp --resume`, and a connection cut under Client.upload resumed within the
call from what the server kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpupool_client import AsyncClient, Client, NotFound

from bench.support.storage import account_volumes, storage_helper, storage_root_for_tests
from gpupool.config import Settings
from tests.client.conftest import issue, live_url
from tests.conftest import base_settings, wait_for
from tests.live.conftest import Server, launch_gunicorn, live_env, stop_gunicorn

pytestmark = [pytest.mark.cluster]

QUOTA = 64 * 1024 * 1024
GPUPOOL_CLIENT = str(Path(sys.executable).parent / "gpupool-client")


def cli_env(server: Server, token: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": token}


@pytest.fixture(scope="module")
def storage_root() -> Iterator[Path]:
    with storage_root_for_tests() as root:
        yield root


@pytest.fixture(scope="module")
def files_server(
    live_db: str, slurm_account: str, job_root: Path, storage_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    settings: Settings = base_settings(storage_root=str(storage_root), job_root=str(job_root))
    with account_volumes(settings, live_url(live_db), [slurm_account], QUOTA), \
            storage_helper(job_root, storage_root, tmp_path_factory.mktemp("files-runas")) as helper:
        env = live_env(live_db, job_root, helper)
        env.update(GPUPOOL_STORAGE_ROOT=str(storage_root), GPUPOOL_RATELIMIT_DEFAULT="100000/minute")
        server = launch_gunicorn(
            tmp_path_factory.mktemp("files-gunicorn"), env, workers=2, as_service=True,
            extra_args=("--worker-class", "gthread", "--threads", "4"),
        )
        yield server
        stop_gunicorn(server)


@pytest.fixture(scope="module")
def files_token(live_db: str, slurm_account: str) -> str:
    return issue(live_db, slurm_account)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def random_file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def cp(server: Server, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUPOOL_CLIENT, "cp", *args], env=cli_env(server, token), capture_output=True, text=True, timeout=120, check=False
    )


def test_cp_ls_rm_and_the_client_move_the_same_bytes_both_ways(files_server: Server, files_token: str, tmp_path: Path) -> None:
    local = random_file(tmp_path / "weights.bin", 6 * 1024 * 1024 + 7)
    up = cp(files_server, files_token, "--progress", str(local), "remote:models/")
    assert up.returncode == 0, up.stderr
    assert "remote:models/weights.bin" in up.stderr and "100%" in up.stderr  # tqdm's bar, asked for
    listed = subprocess.run(
        [GPUPOOL_CLIENT, "ls", "remote:models"], env=cli_env(files_server, files_token), capture_output=True, text=True, check=False
    )
    assert listed.stdout.split()[0] == str(local.stat().st_size) and listed.stdout.split()[-1] == "weights.bin"
    (tmp_path / "back").mkdir()
    down = cp(files_server, files_token, "remote:models/weights.bin", str(tmp_path / "back"))
    assert down.returncode == 0, down.stderr
    assert "%" not in down.stderr  # no terminal, no bar
    assert sha(tmp_path / "back" / "weights.bin") == sha(local)
    assert cp(files_server, files_token, str(local), str(tmp_path / "x")).returncode != 0  # one side must be remote:

    with Client(files_server.url, files_token) as api:
        moved = api.move_file("models/weights.bin", "models/v2/weights.bin")
        assert moved["path"] == "models/v2/weights.bin"
        assert [entry["name"] for entry in api.list_files("models/v2")] == ["weights.bin"]
        api.download("models/v2/weights.bin", tmp_path / "sync.bin")
        assert sha(tmp_path / "sync.bin") == sha(local)

    async def round_trip() -> str:
        async with AsyncClient(files_server.url, files_token) as api:
            await api.upload(local, "async.bin")
            await api.download("async.bin", tmp_path / "async.bin")
            await api.delete_file("async.bin")
            return sha(tmp_path / "async.bin")

    assert asyncio.run(round_trip()) == sha(local)
    removed = subprocess.run(
        [GPUPOOL_CLIENT, "rm", "-r", "remote:models"], env=cli_env(files_server, files_token), capture_output=True, text=True, check=False
    )
    assert removed.returncode == 0, removed.stderr
    with Client(files_server.url, files_token) as api, pytest.raises(NotFound):
        api.list_files("models")


class CuttingProxy:
    """A TCP proxy to the server that passes ``limit`` bytes of the first connection's request, then holds or cuts it.

    ``cut=False`` holds the connection open after the limit (a client that
    stalls, then dies); ``cut=True`` closes both sides (a network cut). Later
    connections pass through whole.
    """

    def __init__(self, upstream_url: str, limit: int, *, cut: bool) -> None:
        host, port = upstream_url.removeprefix("http://").split(":")
        self._upstream = (host, int(port))
        self._limit, self._cut = limit, cut
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections = 0
        self.sent_upstream = 0
        self.release = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(downstream, self.connections == 1), daemon=True).start()

    def _serve(self, downstream: socket.socket, first: bool) -> None:
        upstream = socket.create_connection(self._upstream)

        def answers() -> None:
            try:
                while data := upstream.recv(65536):
                    downstream.sendall(data)
            except OSError:
                pass

        threading.Thread(target=answers, daemon=True).start()
        passed = 0
        try:
            while data := downstream.recv(65536):
                if first and passed + len(data) > self._limit:
                    upstream.sendall(data[: self._limit - passed])
                    self.sent_upstream += self._limit - passed
                    if not self._cut:
                        self.release.wait()
                    break
                upstream.sendall(data)
                passed += len(data)
                self.sent_upstream += len(data)
        except OSError:
            pass
        for sock in (downstream, upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def test_cp_killed_midway_then_resumed_gives_the_whole_file(files_server: Server, files_token: str, tmp_path: Path) -> None:
    local = random_file(tmp_path / "dataset.tar", 12 * 1024 * 1024)
    proxy = CuttingProxy(files_server.url, 5 * 1024 * 1024, cut=False)
    try:
        dying = subprocess.Popen(
            [GPUPOOL_CLIENT, "cp", str(local), "remote:dataset.tar"], env=cli_env(files_server, files_token) | {"GPUPOOL_URL": proxy.url},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        with Client(files_server.url, files_token) as api:
            wait_for(lambda: api.upload_offset("dataset.tar") >= 4 * 1024 * 1024, timeout_s=60, what="part of the upload to be kept")
            dying.send_signal(signal.SIGKILL)
            dying.wait(timeout=30)
            proxy.release.set()  # the dead client's connection closes: the server keeps what arrived
            kept = wait_for(lambda: api.upload_offset("dataset.tar") or None, timeout_s=30, what="the cut to be seen")
            with pytest.raises(NotFound):
                api.download("dataset.tar", tmp_path / "not-yet.tar")
            assert not (tmp_path / "not-yet.tar").exists() and not (tmp_path / "not-yet.tar.part").exists()
    finally:
        proxy.close()
    resumed = cp(files_server, files_token, "--resume", str(local), "remote:dataset.tar")
    assert resumed.returncode == 0, resumed.stderr
    down = cp(files_server, files_token, "remote:dataset.tar", str(tmp_path / "dataset.back"))
    assert down.returncode == 0, down.stderr
    assert sha(tmp_path / "dataset.back") == sha(local)
    assert 0 < kept < local.stat().st_size


def test_client_upload_resumes_after_a_cut_connection_within_the_call(files_server: Server, files_token: str, tmp_path: Path) -> None:
    local = random_file(tmp_path / "checkpoint.pt", 9 * 1024 * 1024)
    proxy = CuttingProxy(files_server.url, 3 * 1024 * 1024 + 100, cut=True)
    try:
        with Client(proxy.url, files_token) as api:
            stored = api.upload(local, "checkpoint.pt")
        assert proxy.connections >= 2  # the cut PUT; then the HEAD that asked what was kept, and the PUT of the rest
        # Resumed, not sent again from the start: the bytes before the cut crossed once.
        assert proxy.sent_upstream < local.stat().st_size + 1024 * 1024
    finally:
        proxy.close()
    assert stored["size"] == local.stat().st_size
    with Client(files_server.url, files_token) as api:
        api.download("checkpoint.pt", tmp_path / "checkpoint.back")
        api.delete_file("checkpoint.pt")
    assert sha(tmp_path / "checkpoint.back") == sha(local)
