"""bench/sessions: what a session's path costs, beside the same app reached directly.

The path a browser's request takes to a session: nginx with the role's config
(rendered by gpupool.proxy), which asks the API (gunicorn, as production runs
it) about the grant cookie, then the shim (gpupool/session_shim.py, the file a
session job runs, with the app in a user and network namespace of its own, as
an unprivileged user), then the app. The shim is started here rather than by
Slurm: what a request costs on its way is the same, and the bench needs no
cluster. The app is one small stdlib HTTP server (a file from tmpfs with
sendfile(2) at /big, two bytes at /small); a second copy of it listens on the
host's loopback: "directly".

Three paths, interleaved round by round: the app directly, the shim in front
of it (with the session's secret, as nginx sends it), and the whole path
(nginx, the shim, the app). For each, the throughput of one download of
``--size-mib`` (256) MiB, the median of ``--downloads`` (5), and the p50 of
``--requests`` (1000) small requests, each on a new connection (one client,
the same for all three). Prints a table, and the whole path against the app:
the targets are at least 0.8 of its throughput and at most 1 ms added to a
small request.

Runs as root on a machine with nginx and njs (make venv-test installs them)
and unprivileged user namespaces. Usage:
    python -m bench.sessions [--size-mib 256] [--downloads 5] [--requests 1000] [--shim PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import os
import pwd
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.support.http import free_port, read_head
from bench.support.processes import NGINX, answers, children, cpu_s, process, wait_until
from gpupool import db
from gpupool.config import load_settings
from gpupool.models import Account, Job, JobSession
from gpupool.models.tokens import IssuedToken
from gpupool.proxy import ProxyConfig, standalone_nginx_conf
from gpupool.sessions import COOKIE_NAME, issue_link, redeem_link
from gpupool.tokens import Principal, issue_token

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PYTHON = "/usr/bin/python3"  # a job's Python: the system's, not the bench's virtualenv
# Unprivileged, as a session's tenant and nginx's workers are.
USER = "nobody"
SHIM_PORTS = "30000-30999"
SMALL_BODY = b"ok"
APP = r'''
import os, socket, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BIG = os.environ["BENCH_BIG_FILE"]

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/big":
            with open(BIG, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                self.wfile.flush()
                offset = 0
                while offset < size:
                    offset += os.sendfile(self.connection.fileno(), handle.fileno(), offset, size - offset)
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

ThreadingHTTPServer.request_queue_size = 128
ThreadingHTTPServer(("127.0.0.1", int(os.environ["GPUPOOL_APP_PORT"])), Handler).serve_forever()
'''


def as_user() -> list[str]:
    user = pwd.getpwnam(USER)
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]


class Target:
    """Where a path's requests go: the port, the headers a client there sends, and the processes on its way."""

    def __init__(self, name: str, port: int, headers: dict[str, str], processes: dict[str, list[int]]) -> None:
        self.name = name
        self.port = port
        self.head = "".join(f"{key}: {value}\r\n" for key, value in headers.items())
        self.processes = processes
        self.cpu: dict[str, float] = {"client": 0.0, **{role: 0.0 for role in processes}}

    def count_cpu(self, work: Callable[[], float]) -> float:
        """Run ``work``, adding the CPU time each process on the way spent meanwhile."""
        before = {role: sum(map(cpu_s, pids)) for role, pids in self.processes.items()}
        client = time.process_time()
        result = work()
        self.cpu["client"] += time.process_time() - client
        for role, pids in self.processes.items():
            self.cpu[role] += sum(map(cpu_s, pids)) - before[role]
        return result

    def request(self, path: str) -> bytes:
        return f"GET {path} HTTP/1.1\r\n{self.head}Connection: close\r\n\r\n".encode()


def small(target: Target) -> float:
    """One small request on a new connection, to the whole answer read: seconds."""
    request = target.request("/small")
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", target.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    elapsed = time.perf_counter() - started
    if not answer.startswith(b"HTTP/1.1 200 ") or not answer.endswith(SMALL_BODY):
        sys.exit(f"bench/sessions: {target.name} answered {answer[:300]!r}")
    return elapsed


def download(target: Target, size: int) -> float:
    """One download of the big file: bytes per second, from the request to its last byte."""
    buffer = bytearray(1 << 20)
    started = time.perf_counter()
    received = 0
    with socket.create_connection(("127.0.0.1", target.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.sendall(target.request("/big"))
        head, first = read_head(sock, buffer)
        if not head.startswith(b"HTTP/1.1 200 "):
            sys.exit(f"bench/sessions: {target.name} answered {head[:300]!r}")
        received = len(first)
        while count := sock.recv_into(buffer):
            received += count
    elapsed = time.perf_counter() - started
    if received != size:
        sys.exit(f"bench/sessions: {target.name} sent {received} bytes of {size}")
    return size / elapsed


def session_rows(url: str, settings_overrides: dict[str, str], shim_port: int, secret: str) -> tuple[str, str]:
    """The database's side of one ready session: its label, and the grant cookie a browser holds."""
    settings = load_settings(environ={}, overrides=settings_overrides)
    engine = db.make_engine(url)
    db.upgrade(engine)
    sessions = db.make_session_factory(engine)
    now = db.utcnow()
    job_id = str(uuid.uuid4())
    with sessions() as session:
        session.add(Account(name="bench", gpu_limit=None))
        session.flush()
        issue_token(session, settings, sub="bench", account="bench", ttl_s=3600)
        jti = session.query(IssuedToken).filter_by(subject="bench").one().jti
        session.add(Job(
            id=job_id, account="bench", owner="bench", name="bench", template="webapp", params={}, gpus=1, cpus=1, mem_gb=1,
            time_limit_min=60, job_dir="/nonexistent", state="RUNNING", finished=False, node=socket.gethostname(),
            started_at=now, request_hash="bench",
        ))
        record = JobSession(job_id=job_id, label=secrets.token_hex(10), secret=secret, idle_timeout_min=30,
                            port=shim_port, ready_at=now, last_active_at=now)
        session.add(record)
        session.flush()
        link = issue_link(session, settings, record, Principal(sub="bench", account="bench", role="customer", jti=jti), now)
        session.commit()
        label = record.label
        cookie = redeem_link(session, settings, label, link.split("?link=", 1)[1], now + dt.timedelta(seconds=1))
    engine.dispose()
    if cookie is None:
        sys.exit("bench/sessions: the bench's link did not redeem")
    return label, cookie


def run(args: argparse.Namespace, tmp: Path) -> list[tuple[Target, float, float]]:
    user = pwd.getpwnam(USER)
    os.chown(tmp, user.pw_uid, user.pw_gid)
    big = Path(tempfile.mkdtemp(prefix="gpupool-bench-", dir="/dev/shm")) / "big"
    size = args.size_mib << 20
    with open(big, "wb") as handle:
        chunk = os.urandom(1 << 20)
        for _ in range(args.size_mib):
            handle.write(chunk)
    big.parent.chmod(0o755)
    big.chmod(0o644)
    (tmp / "app.py").write_text(APP)
    secret = secrets.token_urlsafe(32)
    (tmp / "session.secret").write_text(secret + "\n")
    (tmp / "session.port").write_text("")
    for name in ("app.py", "session.secret", "session.port"):
        os.chown(tmp / name, user.pw_uid, user.pw_gid)
    (tmp / "session.secret").chmod(0o600)
    app_env = {"PATH": "/usr/bin:/bin", "BENCH_BIG_FILE": str(big)}
    proxy_key = secrets.token_urlsafe(32)
    nginx_port, api_port, direct_port = free_port(), free_port(), free_port()
    database = f"sqlite:///{tmp}/gpupool.db"
    overrides = {"jwt_secret": secrets.token_urlsafe(48), "session_proxy_key": proxy_key,
                 "sessions_url": f"http://sessions.localhost:{nginx_port}", "database_url": database}
    with ExitStack() as stack:
        # The app, directly: a second copy on the host's loopback.
        direct = stack.enter_context(
            process([*as_user(), PYTHON, str(tmp / "app.py")], env={**app_env, "GPUPOOL_APP_PORT": str(direct_port)})
        )
        # The shim, as a session job runs it: the app behind it in a namespace of its own.
        shim = stack.enter_context(process(
            [*as_user(), PYTHON, args.shim, "--secret-file", str(tmp / "session.secret"), "--port-file", str(tmp / "session.port"),
             "--ports", SHIM_PORTS, "--", PYTHON, str(tmp / "app.py")],
            env=app_env, stdout=subprocess.DEVNULL,
        ))
        wait_until(lambda: (tmp / "session.port").read_text().strip() != "", "the shim")
        shim_port = int((tmp / "session.port").read_text())
        label, cookie = session_rows(database, overrides, shim_port, secret)
        os.chown(tmp / "gpupool.db", user.pw_uid, user.pw_gid)
        # The API as production runs it: sync workers.
        # PYTHONPATH: this checkout's gpupool, whichever the virtualenv has installed (another version's, when measuring it).
        api_env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp), "PYTHONPATH": str(REPO), "GPUPOOL_RATELIMIT_STORAGE_URI": "memory://",
                   "GPUPOOL_TEMPLATES_DIR": str(REPO / "slurm_templates"), "GPUPOOL_JOB_ROOT": str(tmp),
                   **{f"GPUPOOL_{key.upper()}": value for key, value in overrides.items()}}
        stack.enter_context(process(
            [*as_user(), str(BIN / "gunicorn"), "--workers", "2", "--bind", f"127.0.0.1:{api_port}", "--log-level", "warning",
             "api:create_app()"], cwd=REPO, env=api_env,
        ))
        wait_until(lambda: answers(api_port) and answers(direct_port), "the API and the app")
        state = tmp / "nginx"
        state.mkdir()
        api_url = f"http://127.0.0.1:{api_port}"
        # One client's thousand requests a second are a flood to the role's limits: the bench lifts them (a version
        # without them takes none).
        limits: dict[str, Any] = {"rate_per_s": 1_000_000, "burst": 1_000_000}
        config = ProxyConfig(sessions_domain="sessions.localhost", api_url=api_url, public_api_url=api_url, proxy_key=proxy_key,
                             listen=(f"127.0.0.1:{nginx_port}",),
                             **{key: value for key, value in limits.items() if key in ProxyConfig.__dataclass_fields__})
        (state / "nginx.conf").write_text(standalone_nginx_conf(config, state))
        for path in [state, *state.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid)
        nginx = stack.enter_context(process([*as_user(), NGINX, "-p", str(state), "-c", str(state / "nginx.conf")],
                                            stderr=subprocess.DEVNULL))
        wait_until(lambda: answers(nginx_port), "nginx")
        # nginx's worker and cache manager; the app the shim started.
        shim_app, nginx_workers = children(shim.pid), children(nginx.pid)
        host = f"{label}.sessions.localhost:{nginx_port}"
        targets = [
            Target("the app, directly", direct_port, {"Host": f"127.0.0.1:{direct_port}"}, {"app": [direct.pid]}),
            Target("the shim, then the app", shim_port, {"Host": host, "X-Gpupool-Session-Secret": secret},
                   {"shim": [shim.pid], "app": shim_app}),
            Target("nginx, the shim, the app (a session)", nginx_port, {"Host": host, "Cookie": f"{COOKIE_NAME}={cookie}"},
                   {"nginx": nginx_workers, "shim": [shim.pid], "app": shim_app}),
        ]
        for target in targets:  # warm: connections, nginx's cached answer, the page cache
            for _ in range(20):
                small(target)
            download(target, size)
        latencies: dict[str, list[float]] = {target.name: [] for target in targets}
        rates: dict[str, list[float]] = {target.name: [] for target in targets}
        for _ in range(args.requests):
            for target in targets:
                latencies[target.name].append(small(target))
        for target in targets:
            target.cpu = dict.fromkeys(target.cpu, 0.0)
        for _ in range(args.downloads):
            for target in targets:
                rates[target.name].append(target.count_cpu(functools.partial(download, target, size)))
    shutil.rmtree(big.parent, ignore_errors=True)
    return [(target, statistics.median(rates[target.name]), statistics.median(latencies[target.name])) for target in targets]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--downloads", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--shim", default=str(REPO / "gpupool" / "session_shim.py"), help="the shim to measure (another version's)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/sessions runs as root (it starts the app, the shim and nginx as an unprivileged user)")
    for tool in (NGINX, PYTHON, shutil.which("setpriv") or "/usr/bin/setpriv"):
        if not Path(tool).exists():
            sys.exit(f"bench/sessions needs {tool} (make venv-test installs nginx and njs; setpriv is util-linux's)")
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-sessions-", dir="/var/tmp") as tmp:
        results = run(args, Path(tmp))
    (_direct, direct_rate, direct_p50), (_session, session_rate, session_p50) = results[0], results[-1]
    title = f"bench/sessions: a {args.size_mib} MiB download (median of {args.downloads}) and a small request (p50 of {args.requests})"
    print(f"\n{title}\n" + "-" * len(title))
    width = max(len(target.name) for target, _, _ in results)
    roles = ["client", "nginx", "shim", "app"]
    print(f"{'path':<{width}}  {'download':>10}  {'small p50':>10}   CPU ms per GiB downloaded: " + ", ".join(roles))
    gib = args.downloads * args.size_mib / 1024
    for target, rate, p50 in results:
        cpu = "  ".join(f"{target.cpu[role] * 1e3 / gib:>6.0f}" if role in target.cpu else f"{'-':>6}" for role in roles)
        print(f"{target.name:<{width}}  {rate / 1e9:>5.2f} GB/s  {p50 * 1e3:>7.2f} ms   {cpu}")
    print(f"{'a session against the app':<{width}}  {session_rate / direct_rate:>9.2f}x  {(session_p50 - direct_p50) * 1e3:>+7.2f} ms"
          "   (targets: 0.80x or more, +1.00 ms or less)")
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

if __name__ == "__main__":
    main()
