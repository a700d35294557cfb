"""bench/files: a file up and down through /files as production serves it, beside nginx and a plain copy.

The API as the playbook deploys it: gunicorn (gthread, min(2 × CPUs + 1, 9)
workers of 4 threads) as the unprivileged service user, every file opened by
the run-as helper as the account's Unix user, and nginx in front with the
role's own site (deploy/ansible/roles/gpupool_api/templates/nginx-site.conf.j2,
rendered here with the role's defaults; only its port differs) inside the
http settings of Debian's nginx.conf (sendfile, tcp_nopush). The account's
storage is a real volume (an ext4 image, loop-mounted, its size the quota),
made for the bench's throwaway account.

Side by side, each round interleaved, one transfer at a time:
- download: nginx serving the same file itself (a second server of the same
  nginx, whose workers run as the account's user: sendfile from the volume),
  the API behind nginx, and the API (gunicorn) reached directly;
- upload: a plain copy of the same source file into the same volume as the
  account's user (dd, 1 MiB blocks, conv=fsync, as the API fsyncs before it
  answers), the API behind nginx, and the API directly.
The client is one Python process: sendfile(2) of the source file for a PUT,
recv_into one reused buffer for a GET, so that it costs little beside what is
measured. While an API transfer runs, a thread samples the resident memory
(VmRSS, /proc) of every gunicorn worker: its growth is the peak during the
transfer less the sum just before it. The CPU each process used (/proc) is
given per GiB moved.

Targets (issue 33): the API's download at least 0.5× nginx's own, its upload at
least 0.5× the plain copy, and its memory growth under 50 MB for a 1 GiB
transfer. The bench prints each beside its figure; like the other benches it
exits 0 whatever they are (non-zero only when something fails).

Runs as root (it makes a loop-mounted volume and a tenant user), with the
services and the local cluster up (make services cluster) and nginx installed
(make venv-test). Usage:
    python -m bench.files [--size 1G] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import grp
import hashlib
import os
import pwd
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from bench._harness import REPO, bench_env, gunicorn, table
from bench._profile import parent_of, pids_with_argument
from bench.support.http import free_port, http, read_head
from bench.support.processes import NGINX, answers, children, cpu_s, process, wait_until
from bench.support.storage import account_volumes, storage_root_for_tests
from bench.support.tenancy import TENANT_PREFIX
from gpupool.config import load_settings
from gpupool.proc import run_command
from gpupool.storage.paths import account_storage_dir
from gpupool.storage.sizes import format_size, parse_size

SITE_TEMPLATE = REPO / "deploy/ansible/roles/gpupool_api/templates/nginx-site.conf.j2"
THREADS = 4  # gpupool_api_threads
CHUNK = 1 << 20
FOLDER = "bench"
SAMPLE_S = 0.02
TARGET_DOWNLOAD = 0.5
TARGET_UPLOAD = 0.5
TARGET_RSS_BYTES = 50_000_000


def _role_defaults() -> dict[str, object]:
    """The role's variables the site uses, as its defaults set them (the host's facts filled in for loopback)."""
    return {
        "ansible_managed": "rendered by bench/files",
        "gpupool_api_tls_mode": "http",
        "gpupool_api_private_address": "127.0.0.1",
        "gpupool_api_server_name": "localhost",
        "gpupool_api_max_body_kb": 256,
        "gpupool_api_files_timeout_s": 300,
        "gpupool_api_timeout_s": 30,
    }


def nginx_conf(state: Path, *, api_bind: str, site_port: int, static_port: int, static_root: str, user: str) -> str:
    """A whole nginx.conf: Debian's http settings, the role's site in front of ``api_bind``, and a static server."""
    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (state / name).mkdir(exist_ok=True)
    site = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True).from_string(
        SITE_TEMPLATE.read_text()
    ).render(gpupool_api_bind=api_bind, **_role_defaults())
    # The role listens on port 80 of the private address; the bench on a free port of loopback.
    listen = "listen 127.0.0.1:80;"
    if listen not in site:
        sys.exit(f"bench/files: the role's site no longer has {listen!r}; update the bench")
    site = site.replace(listen, f"listen 127.0.0.1:{site_port};")
    return f"""daemon off;
user {user};
worker_processes auto;
pid {state}/nginx.pid;
error_log stderr warn;
events {{
    worker_connections 768;
}}
http {{
    # Debian's nginx.conf, as the playbook leaves it.
    sendfile on;
    tcp_nopush on;
    types_hash_max_size 2048;
    default_type application/octet-stream;
    access_log off;
    client_body_temp_path {state}/client_body;
    proxy_temp_path {state}/proxy;
    fastcgi_temp_path {state}/fastcgi;
    uwsgi_temp_path {state}/uwsgi;
    scgi_temp_path {state}/scgi;
{site}
    # nginx serving the account's files itself, from the same volume.
    server {{
        listen 127.0.0.1:{static_port};
        location /raw/ {{
            alias {static_root}/;
        }}
    }}
}}
"""


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@contextmanager
def rss_peak(pids: list[int]) -> Iterator[list[int]]:
    """The gunicorn workers' summed RSS growth over the block: [growth in bytes] once it ends."""
    before = sum(map(rss_bytes, pids))
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_S):
            peak[0] = max(peak[0], sum(map(rss_bytes, pids)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    growth = [0]
    try:
        yield growth
    finally:
        done.set()
        sampler.join()
        growth[0] = max(peak[0], sum(map(rss_bytes, pids))) - before


@dataclass
class Side:
    """One way of moving the file: its transfer, and the processes whose CPU and memory it is charged."""

    name: str
    transfer: Callable[[], None]
    processes: dict[str, list[int]]
    api: bool = False
    rates: list[float] = field(default_factory=list)
    growth: list[int] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)

    def run(self, size: int, workers: list[int]) -> None:
        before = {role: sum(map(cpu_s, pids)) for role, pids in self.processes.items()}
        client = time.process_time()
        children = os.times()
        with rss_peak(workers if self.api else []) as growth:
            started = time.perf_counter()
            self.transfer()
            elapsed = time.perf_counter() - started
        after = os.times()
        self.rates.append(size / elapsed)
        if self.api:
            self.growth.append(growth[0])
        spent = {role: sum(map(cpu_s, pids)) - before[role] for role, pids in self.processes.items()}
        spent["client"] = time.process_time() - client + (after.children_user + after.children_system) - (
            children.children_user + children.children_system
        )
        for role, value in spent.items():
            self.cpu[role] = self.cpu.get(role, 0.0) + value


def _request_head(method: str, target: str, port: int, token: str | None, length: int | None) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    if length is not None:
        lines += [f"Content-Length: {length}", "Content-Type: application/octet-stream"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def download(port: int, target: str, token: str | None, size: int, digest: str | None = None) -> None:
    """One GET to its last byte; with ``digest``, the bytes checked against it (SHA-256)."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    hasher = hashlib.sha256() if digest else None
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.sendall(_request_head("GET", target, port, token, None))
        head, first = read_head(sock, buffer)
        if not head.startswith(b"HTTP/1.1 200 "):
            sys.exit(f"bench/files: GET {target} on port {port} answered {head[:300]!r}")
        received = len(first)
        if hasher:
            hasher.update(first)
        while count := sock.recv_into(buffer):
            received += count
            if hasher:
                hasher.update(view[:count])
    if received != size:
        sys.exit(f"bench/files: GET {target} on port {port} sent {received} bytes of {size}")
    if hasher and hasher.hexdigest() != digest:
        sys.exit(f"bench/files: GET {target} on port {port} sent other bytes than were uploaded")


def upload(port: int, target: str, token: str, source: Path) -> None:
    """One PUT of ``source`` (sendfile from it), to the API's answer."""
    size = source.stat().st_size
    buffer = bytearray(65536)
    with socket.create_connection(("127.0.0.1", port)) as sock, open(source, "rb") as handle:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sock.sendall(_request_head("PUT", target, port, token, size))
        sock.sendfile(handle)
        head, _ = read_head(sock, buffer)
    if not head.startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 201 ")):
        sys.exit(f"bench/files: PUT {target} on port {port} answered {head[:300]!r}")


def plain_copy(source: Path, destination: Path, tenant: pwd.struct_passwd) -> None:
    """dd as the account's user into its volume, 1 MiB blocks, synced to disk before it ends."""
    run_command(
        ["setpriv", f"--reuid={tenant.pw_uid}", f"--regid={tenant.pw_gid}", "--init-groups", "--",
         "dd", f"if={source}", f"of={destination}", f"bs={CHUNK}", "conv=fsync", "status=none"],
        timeout_s=600, env={"PATH": "/usr/bin:/bin"},
    )


def make_source(path: Path, size: int) -> str:
    """``size`` random bytes (fresh every MiB) into ``path``; their SHA-256."""
    hasher = hashlib.sha256()
    with open(path, "wb") as handle:
        left = size
        while left > 0:
            chunk = os.urandom(min(CHUNK, left))
            hasher.update(chunk)
            handle.write(chunk)
            left -= len(chunk)
    path.chmod(0o644)
    return hasher.hexdigest()


def run(args: argparse.Namespace, tmp: Path) -> tuple[list[Side], list[Side]]:
    size = args.size
    tmp.chmod(0o711)  # the tenant's dd reads the source file
    source = tmp / "source.bin"
    digest = make_source(source, size)
    # Room for the file downloaded, an upload beside the file it replaces, and the plain copy.
    quota = 3 * size + 256 * CHUNK
    with ExitStack() as stack:
        root = stack.enter_context(storage_root_for_tests())
        env = stack.enter_context(bench_env(tmp, slurm_gpu_limit=0, runas_env={"GPUPOOL_STORAGE_ROOT": str(root)}))
        account, token = env["account"], env["token"]
        settings = load_settings(environ={}, overrides={"storage_root": str(root), "job_root": str(env["job_root"])})
        stack.enter_context(account_volumes(settings, env["database_url"], [account], quota))
        workers = min(2 * (os.cpu_count() or 1) + 1, 9)
        url = stack.enter_context(gunicorn(env, workers=workers, threads=THREADS, storage_root=str(root)))
        api_bind = url.removeprefix("http://")
        api_port = int(api_bind.rsplit(":", 1)[1])
        pids = pids_with_argument(api_bind)
        master = next(pid for pid in pids if parent_of(pid) not in pids)
        gunicorn_workers = children(master)
        tenant = pwd.getpwnam(TENANT_PREFIX + account)
        volume = account_storage_dir(str(root), account)
        state = tmp / "nginx"
        state.mkdir()
        site_port, static_port = free_port(), free_port()
        (state / "nginx.conf").write_text(nginx_conf(
            state, api_bind=api_bind, site_port=site_port, static_port=static_port, static_root=volume,
            user=f"{tenant.pw_name} {grp.getgrgid(tenant.pw_gid).gr_name}",
        ))
        nginx = stack.enter_context(process([NGINX, "-p", str(state), "-c", str(state / "nginx.conf")]))
        wait_until(lambda: nginx.poll() is None and answers(site_port) and answers(static_port), "nginx")
        nginx_workers = children(nginx.pid)

        if http("PUT", f"{url}/files/{FOLDER}/", token=token).status not in (200, 201):
            sys.exit("bench/files: the API did not make the bench's folder")
        down, up, copy = f"/files/{FOLDER}/down.bin", f"/files/{FOLDER}/up.bin", Path(volume) / FOLDER / "copy.bin"
        upload(api_port, down, token, source)
        # Warm and check: each way of downloading sends the bytes uploaded, once, untimed.
        download(static_port, f"/raw/{FOLDER}/down.bin", None, size, digest)
        download(site_port, down, token, size, digest)
        download(api_port, down, token, size, digest)

        api = {"api workers": gunicorn_workers}
        behind_nginx = {"nginx": nginx_workers, "api workers": gunicorn_workers}
        downloads = [
            Side("nginx serving the file itself", lambda: download(static_port, f"/raw/{FOLDER}/down.bin", None, size),
                 {"nginx": nginx_workers}),
            Side("the API behind nginx (as deployed)", lambda: download(site_port, down, token, size), behind_nginx, api=True),
            Side("the API alone (gunicorn)", lambda: download(api_port, down, token, size), api, api=True),
        ]
        uploads = [
            Side("a plain copy (dd, fsync) into the volume", lambda: plain_copy(source, copy, tenant), {}),
            Side("the API behind nginx (as deployed)", lambda: upload(site_port, up, token, source), behind_nginx, api=True),
            Side("the API alone (gunicorn)", lambda: upload(api_port, up, token, source), api, api=True),
        ]

        def clear() -> None:
            # Each upload starts from the same free space: the one before goes.
            copy.unlink(missing_ok=True)
            if http("DELETE", f"{url}{up}", token=token).status not in (204, 404):
                sys.exit("bench/files: the API did not delete the upload")

        # Untimed, each way once: the volume's image is preallocated, and the first write to a block of it
        # costs the backing filesystem an extent conversion that later writes do not pay.
        for side in uploads:
            side.transfer()
            clear()
        for _ in range(args.rounds):
            for side in downloads:
                side.run(size, gunicorn_workers)
            for side in uploads:
                side.run(size, gunicorn_workers)
                clear()
        # The last upload was whole: its bytes, checked once more, untimed.
        upload(site_port, up, token, source)
        download(api_port, up, token, size, digest)
    return downloads, uploads


def rate_text(rate: float) -> str:
    return f"{rate / 1e6:,.0f} MB/s"


def report(args: argparse.Namespace, downloads: list[Side], uploads: list[Side], started: dt.datetime) -> None:
    size, rounds = args.size, args.rounds
    gib = rounds * size / (1 << 30)
    roles = ["client", "nginx", "api workers"]
    rows: list[tuple[str, str]] = [("", f"{'throughput':>11}  {'ratio':>6}  {'API RSS growth':>14}   CPU ms per GiB: " + ", ".join(roles))]
    for way, sides in (("download", downloads), ("upload", uploads)):
        baseline = statistics.median(sides[0].rates)
        for side in sides:
            rate = statistics.median(side.rates)
            growth = f"{max(side.growth) / 1e6:.1f} MB" if side.growth else "-"
            cpu = "  ".join(f"{side.cpu[role] * 1e3 / gib:>6.0f}" if role in side.cpu else f"{'-':>6}" for role in roles)
            rows.append((f"{way}: {side.name}", f"{rate_text(rate):>11}  {rate / baseline:>5.2f}x  {growth:>14}   {cpu}"))
    load = os.getloadavg()
    table(
        f"bench/files: {format_size(size)} each way, median of {rounds} interleaved rounds "
        f"({started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})",
        rows,
    )
    download_ratio = statistics.median(downloads[1].rates) / statistics.median(downloads[0].rates)
    upload_ratio = statistics.median(uploads[1].rates) / statistics.median(uploads[0].rates)
    worst = max(max(side.growth) for side in (*downloads, *uploads) if side.growth)
    # The memory target is for a 1 GiB transfer; a smaller run is held to it as it is.

    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    table("targets (the API behind nginx, as deployed)", [
        ("download, API / nginx itself", f"{download_ratio:.2f}x (target >= {TARGET_DOWNLOAD}): {verdict(download_ratio >= TARGET_DOWNLOAD)}"),
        ("upload, API / plain copy", f"{upload_ratio:.2f}x (target >= {TARGET_UPLOAD}): {verdict(upload_ratio >= TARGET_UPLOAD)}"),
        ("API workers' RSS growth, worst transfer", f"{worst / 1e6:.1f} MB (target < {TARGET_RSS_BYTES // 1_000_000} MB): "
         f"{verdict(worst < TARGET_RSS_BYTES)}"),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=1 << 30, help="bytes moved each way, e.g. 1G (the default), 256M")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/files runs as root (it makes the account's loop-mounted volume and starts nginx)")
    for tool in (NGINX, shutil.which("setpriv") or "/usr/bin/setpriv", shutil.which("dd") or "/usr/bin/dd"):
        if not Path(tool).exists():
            sys.exit(f"bench/files needs {tool} (make venv-test installs nginx)")
    started = dt.datetime.now(dt.UTC)
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-files-", dir="/var/tmp") as tmp:
        downloads, uploads = run(args, Path(tmp))
    report(args, downloads, uploads, started)


if __name__ == "__main__":
    main()
