"""The customers' client against gunicorn on the real local cluster.

Two accounts: the session's own, whose jobs run, and one whose Slurm GPU limit
is 0, whose jobs stay pending (AssocGrpGRES) so hundreds of them cost no CPU.
"""

from __future__ import annotations

import re
import secrets
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gpupool_client import Client

from gpupool import db
from gpupool.slurm.client import SlurmClient
from gpupool.tokens import issue_token
from tests.conftest import REPO, add_account_row, base_settings, slurm_cmd, throwaway_slurm_account
from tests.live import conftest as live
from tests.live.conftest import Server

# The live suite's gunicorn fixtures, offered to this package's tests too.
live_db = live.live_db
start_server = live.start_server

# Templates only these tests use.
CLIENT_TEMPLATES = {
    "fail": ('description = "Exit with status 3."\n', "echo failing >&2\nexit 3\n"),
    "count": (
        'description = "Print numbered lines, pausing after every thousand."\n'
        "[params.lines]\ntype = \"integer\"\nminimum = 1\nmaximum = 100000\ndefault = 10000\n",
        'for ((i = 1; i <= GPUPOOL_PARAM_LINES; i++)); do\n'
        '  printf "line %d\\n" "$i"\n'
        "  if ((i % 1000 == 0)); then sleep 0.3; fi\n"
        "done\n",
    ),
}


def live_url(database: str) -> str:
    return f"postgresql://postgres@127.0.0.1:5432/{database}"


@pytest.fixture(scope="module")
def client_templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("client-templates")
    for shipped in (REPO / "slurm_templates").iterdir():
        shutil.copytree(shipped, root / shipped.name)
    for name, (spec, body) in CLIENT_TEMPLATES.items():
        (root / name).mkdir()
        (root / name / "template.toml").write_text(spec)
        (root / name / "run.sh").write_text(body)
    return root


@pytest.fixture(scope="module")
def pending_account(slurm: SlurmClient, live_db: str) -> Iterator[str]:
    """An account whose jobs never start: Slurm allows it 0 GPUs, the API up to 4."""
    with throwaway_slurm_account(slurm, "p", gpu_limit=0) as name:
        engine = db.make_engine(live_url(live_db))
        add_account_row(db.make_session_factory(engine), name)
        engine.dispose()
        yield name


def issue(live_db: str, account: str) -> str:
    """A recorded customer token; a fresh subject each time, so rate-limit counters never carry over."""
    engine = db.make_engine(live_url(live_db))
    with db.make_session_factory(engine)() as session, session.begin():
        token = issue_token(session, base_settings(), sub=f"client-{secrets.token_hex(4)}", account=account, ttl_s=3600)
    engine.dispose()
    return token


@pytest.fixture
def server(start_server: Callable[..., Server], client_templates: Path) -> Server:
    return start_server(
        workers=2,
        templates_dir=str(client_templates),
        ratelimit_default="100000/minute",
        ratelimit_submit="100000/minute",
    )


@pytest.fixture
def token(live_db: str, slurm_account: str) -> str:
    return issue(live_db, slurm_account)


@pytest.fixture
def client(server: Server, token: str) -> Iterator[Client]:
    with Client(server.url, token) as api:
        yield api


@pytest.fixture
def pending_token(live_db: str, pending_account: str) -> str:
    return issue(live_db, pending_account)


@pytest.fixture
def pending_client(server: Server, pending_token: str) -> Iterator[Client]:
    with Client(server.url, pending_token) as api:
        yield api


def queued_with_tag(account: str, job_id: str) -> list[str]:
    """Slurm job ids in the queue carrying the job's tag, as squeue reports them."""
    rows = slurm_cmd("squeue", "-h", "-a", f"--account={account}", "-o", "%k|%i").split()
    return [row.split("|")[1] for row in rows if row.split("|")[0] == f"gpupool:{job_id}"]


class DroppingProxy:
    """A TCP proxy to the server that loses the answer to the first ``POST /submit``.

    The request reaches the server whole and the server answers (so the job
    exists); the proxy then closes the client's connection without passing the
    answer on, as a load balancer restart or a network cut would.
    """

    def __init__(self, upstream_url: str) -> None:
        host, port = re.fullmatch(r"http://([^:/]+):(\d+)", upstream_url).groups()  # type: ignore[union-attr]
        self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self.submit_keys: list[str | None] = []
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(downstream,), daemon=True).start()

    def _serve(self, downstream: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._upstream)
        except OSError:
            # The server has gone (its test is over, a client still retrying): close, as a proxy would.
            downstream.close()
            return
        drop_answer = threading.Event()

        def close_both() -> None:
            for sock in (downstream, upstream):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

        def requests() -> None:
            try:
                while data := downstream.recv(65536):
                    if data.startswith(b"POST /submit"):
                        key = re.search(rb"(?im)^idempotency-key: *([^\r\n]*)", data)
                        with self._lock:
                            self.submit_keys.append(key.group(1).decode() if key else None)
                            if self.dropped == 0:
                                self.dropped = 1
                                drop_answer.set()
                    upstream.sendall(data)
            except OSError:
                pass

        def answers() -> None:
            try:
                while data := upstream.recv(65536):
                    if drop_answer.is_set():
                        close_both()
                        return
                    downstream.sendall(data)
            except OSError:
                pass
            close_both()

        threading.Thread(target=requests, daemon=True).start()
        answers()


@pytest.fixture
def dropping_proxy(server: Server) -> Iterator[DroppingProxy]:
    proxy = DroppingProxy(server.url)
    yield proxy
    proxy.close()
