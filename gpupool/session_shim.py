"""The authenticating front of an interactive session, run inside the tenant's job.

gpupool writes this file into a session job's folder and runs it there, in
whatever Python the job's environment or image has: it uses the standard
library alone and the syntax of Python 3.7. It

- starts the session's app (the command after ``--``) in a user and network
  namespace of its own, so that the app's 127.0.0.1 (``GPUPOOL_APP_HOST`` and
  ``GPUPOOL_APP_PORT``) is private: no other job on the node, whatever its uid,
  can connect to it. A forwarder in that namespace (this file again, with
  ``--inner``) takes connections on a Unix socket in a 0700 folder of the
  job's own and passes them to the app's port. A node that cannot make the
  namespaces (user.max_user_namespaces = 0, a seccomp or AppArmor rule) fails
  the session with exit code 78 and says why on stderr: the app is never left
  on the node's shared loopback;
- listens on the node's cluster address (never on all interfaces), on a free
  port of the operator's session range, and writes that port, and nothing
  else, into the port file the run-as helper made, once the app answers;
- lets a connection through only when its first request carries the
  session's secret in ``X-Gpupool-Session-Secret``, which only gpupool's
  proxy and this job know; any other caller (another tenant's job on the same
  node included) gets 403 and never reaches the app;
- counts open WebSockets and the time of the last byte relayed, and answers
  ``GET /.gpupool-shim/status`` (with the secret) for gpupool's idle stop.

The secret comes from a file only the tenant can read, and reaches the app, if
at all, through an environment variable (``--secret-env``), never a command
line, which every user of the node can read in /proc.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

SECRET_HEADER = "x-gpupool-session-secret"
STATUS_PATH = "/.gpupool-shim/status"
MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CHUNK = 64 * 1024
REFUSAL_BODY = b"gpupool session: this session's secret is missing or wrong\n"
# EX_CONFIG: gpupool reads this exit code as "the node cannot keep the app private".
NO_PRIVATE_NETWORK_EXIT = 78
APP_SOCKET_NAME = "app.sock"
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFREQ_FLAGS = "16sh22x"


class Activity:
    """What the idle stop needs: when a byte last went through, and how many WebSockets are open."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last_active = time.monotonic()
        self.websockets = 0

    def touch(self) -> None:
        self.last_active = time.monotonic()  # one float store: no lock needed

    def websocket(self, delta: int) -> None:
        with self._lock:
            self.websockets += delta
        self.touch()

    def status(self) -> dict:
        return {"idle_s": int(time.monotonic() - self.last_active), "websockets": self.websockets}


def parse_ports(text: str) -> tuple[int, int]:
    low_text, _, high_text = text.partition("-")
    low, high = int(low_text), int(high_text or low_text)
    if not 1024 <= low <= high <= 65535:
        raise ValueError("the session port range must lie within 1024-65535, low-high")
    return low, high


def node_address() -> str:
    """The node's cluster address: what its Slurm node name resolves to, as gpupool resolves it too."""
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"the node name {name!r} does not resolve to an IPv4 address")
    return str(infos[0][4][0])


def listen_in_range(host: str, low: int, high: int) -> socket.socket:
    ports = list(range(low, high + 1))
    random.shuffle(ports)
    for port in ports[:500]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            continue
        sock.listen(64)
        return sock
    raise OSError(f"no free port in {low}-{high} on {host}")


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """The request head (through the blank line) and whatever body bytes came with it."""
    data = b""
    conn.settimeout(HEAD_TIMEOUT_S)
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise ValueError("request head too large")
        chunk = conn.recv(CHUNK)
        if not chunk:
            raise ValueError("connection closed before a whole request head")
        data += chunk
    conn.settimeout(None)
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def split_head(head: bytes) -> tuple[bytes, list[tuple[str, bytes]]]:
    lines = head.split(b"\r\n")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError("malformed header line")
        headers.append((name.strip().decode("latin-1").lower(), value.strip()))
    return lines[0], headers


def answer(conn: socket.socket, status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    conn.sendall(head.encode("latin-1") + body)


def relay(source: socket.socket, target: socket.socket, activity: Activity) -> None:
    try:
        while True:
            chunk = source.recv(CHUNK)
            if not chunk:
                break
            target.sendall(chunk)
            activity.touch()
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Shim:
    def __init__(self, secret: bytes, app_socket: str, upstream_header: bytes | None, activity: Activity) -> None:
        self.secret = secret
        self.app_socket = app_socket
        self.upstream_header = upstream_header
        self.upstream_header_name = (upstream_header or b"").partition(b":")[0].strip().decode("latin-1").lower()
        self.activity = activity

    def serve(self, listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def _handle(self, conn: socket.socket) -> None:
        head, rest = read_head(conn)
        request_line, headers = split_head(head)
        sent = [value for name, value in headers if name == SECRET_HEADER]
        # One header, equal to the secret, compared in constant time.
        if len(sent) != 1 or not hmac.compare_digest(sent[0], self.secret):
            answer(conn, "403 Forbidden", REFUSAL_BODY)
            return
        parts = request_line.split(b" ")
        if len(parts) == 3 and parts[1] == STATUS_PATH.encode():
            answer(conn, "200 OK", json.dumps(self.activity.status()).encode(), "application/json")
            return
        upgrade = any(name == "upgrade" and value.lower() == b"websocket" for name, value in headers)
        # What the shim adds for the app (JupyterLab's token) replaces whatever the browser sent under that name.
        replaced = {SECRET_HEADER, self.upstream_header_name}
        kept = [(name, value) for name, value in headers if name not in replaced]
        if not upgrade:
            # One request per upstream connection: every request the app sees was checked here.
            kept = [(name, value) for name, value in kept if name not in ("connection", "keep-alive")]
            kept.append(("connection", b"close"))
        lines = [request_line] + [name.encode("latin-1") + b": " + value for name, value in kept]
        if self.upstream_header is not None:
            lines.append(self.upstream_header)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.settimeout(10)
        upstream.connect(self.app_socket)
        upstream.settimeout(None)
        try:
            upstream.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + rest)
            self.activity.touch()
            if upgrade:
                self.activity.websocket(+1)
            try:
                back = threading.Thread(target=relay, args=(upstream, conn, self.activity), daemon=True)
                back.start()
                relay(conn, upstream, self.activity)
                back.join()
            finally:
                if upgrade:
                    self.activity.websocket(-1)
        finally:
            upstream.close()


def app_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class NoPrivateNetwork(Exception):
    """The kernel or the job's sandbox refused a user+network namespace."""


def _unshare(flags: int) -> None:
    if hasattr(os, "unshare"):  # Python 3.12+
        os.unshare(flags)
        return
    import ctypes  # only here: an image's Python may lack it, and then this node cannot isolate the app

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def enter_private_network() -> None:
    """Move this process into a new user and network namespace whose loopback only it and its children share.

    The uid and gid map to themselves, so the app keeps the tenant's identity on
    files; the capabilities the new namespace grants go at the app's exec.
    """
    uid, gid = os.getuid(), os.getgid()
    try:
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)
        with open("/proc/self/setgroups", "w") as handle:
            handle.write("deny")
        with open("/proc/self/uid_map", "w") as handle:
            handle.write(f"{uid} {uid} 1\n")
        with open("/proc/self/gid_map", "w") as handle:
            handle.write(f"{gid} {gid} 1\n")
        # A new network namespace's loopback starts down; `ip` may not be in the image.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            import fcntl

            request = struct.pack(IFREQ_FLAGS, b"lo", 0)
            flags = struct.unpack(IFREQ_FLAGS, fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(IFREQ_FLAGS, b"lo", flags | IFF_UP))
    except (OSError, ImportError) as exc:
        raise NoPrivateNetwork(str(exc)) from exc
    interfaces = sorted(name for _, name in socket.if_nameindex())
    if interfaces != ["lo"]:
        raise NoPrivateNetwork(f"the new network namespace has interfaces {interfaces}, not just lo")


def forward(listener: socket.socket, app_port: int) -> None:
    """Inside the namespace: each connection on the Unix socket goes to the app's loopback port."""
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=forward_one, args=(conn, app_port), daemon=True).start()


def forward_one(conn: socket.socket, app_port: int) -> None:
    try:
        with socket.create_connection(("127.0.0.1", app_port), timeout=10) as upstream:
            upstream.settimeout(None)
            unused = Activity()  # the shim outside counts activity
            back = threading.Thread(target=relay, args=(upstream, conn, unused), daemon=True)
            back.start()
            relay(conn, upstream, unused)
            back.join()
    except OSError:
        pass
    finally:
        conn.close()


def run_inner(app_socket: str, command: list[str]) -> int:
    """The app's side: a private network, the app on its loopback, the forwarder on the Unix socket."""
    try:
        enter_private_network()
    except NoPrivateNetwork as exc:
        print(
            "gpupool session: this node cannot give the app a private network (an unprivileged user+network "
            f"namespace: {exc}); the session does not start rather than leave the app on the node's shared loopback. "
            "The operator must allow user namespaces on the node (user.max_user_namespaces > 0).",
            file=sys.stderr, flush=True,
        )
        return NO_PRIVATE_NETWORK_EXIT
    app_port = free_loopback_port()
    env = dict(os.environ, GPUPOOL_APP_HOST="127.0.0.1", GPUPOOL_APP_PORT=str(app_port))
    app = subprocess.Popen(command, env=env)
    install_stop(app)
    while not app_answers(app_port):
        if app.poll() is not None:
            print(f"gpupool session: the app exited with {app.returncode} before it answered", file=sys.stderr)
            return app.returncode or 1
        time.sleep(0.5)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(app_socket)  # in the 0700 folder the shim made: no other uid can even reach it
    listener.listen(64)
    threading.Thread(target=forward, args=(listener, app_port), daemon=True).start()
    return app.wait()


def install_stop(child: subprocess.Popen) -> None:
    def stop(signum: int, _frame: object) -> None:
        # Slurm's SIGTERM at cancel, idle stop or time limit: the child first, then this process.
        child.send_signal(signum)
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def app_socket_answers(path: str) -> bool:
    if not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
            return True
        except OSError:
            return False


def private_folder() -> str:
    """A 0700 folder for the app's Unix socket, with a path short enough for one (108 bytes)."""
    folder = tempfile.mkdtemp(prefix="gpupool-session-")
    if len(folder) > 80:
        os.rmdir(folder)
        folder = tempfile.mkdtemp(prefix="gpupool-session-", dir="/tmp")
    os.chmod(folder, 0o700)
    return folder


def write_port_file(path: str, port: int) -> None:
    # The run-as helper made this file (tenant:service 0640): write into it, never replace it.
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{port}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inner", metavar="SOCKET", help=argparse.SUPPRESS)  # the shim's own call, in the namespace
    parser.add_argument("--secret-file")
    parser.add_argument("--port-file")
    parser.add_argument("--ports", help="the operator's session port range, low-high")
    parser.add_argument("--secret-env", help="also give the app the secret in this environment variable")
    parser.add_argument("--upstream-header", help="a header added to each request to the app; {secret} is replaced")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the app's command after --")
    if args.inner:
        return run_inner(args.inner, command)
    if not (args.secret_file and args.port_file and args.ports):
        parser.error("--secret-file, --port-file and --ports are required")
    with open(args.secret_file, "rb") as handle:
        secret = handle.read().strip()
    if len(secret) < 32:
        print("gpupool session: the secret file holds no secret", file=sys.stderr)
        return 2
    low, high = parse_ports(args.ports)
    host = node_address()
    listener = listen_in_range(host, low, high)
    env = dict(os.environ)
    if args.secret_env:
        env[args.secret_env] = secret.decode()
    header = None
    if args.upstream_header:
        header = args.upstream_header.replace("{secret}", secret.decode()).encode("latin-1")
    folder = private_folder()
    try:
        app_socket = os.path.join(folder, APP_SOCKET_NAME)
        inner = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--inner", app_socket, "--", *command], env=env)
        install_stop(inner)
        while not app_socket_answers(app_socket):
            if inner.poll() is not None:
                return inner.returncode or 1
            time.sleep(0.5)
        shim = Shim(secret, app_socket, header, Activity())
        threading.Thread(target=shim.serve, args=(listener,), daemon=True).start()
        write_port_file(args.port_file, listener.getsockname()[1])
        print(f"gpupool session: listening on {host}:{listener.getsockname()[1]}", flush=True)
        return inner.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
