"""The authenticating front of an interactive session, run inside the tenant's job.

gpupool writes this file into a session job's folder and runs it there, in
whatever Python the job's environment or image has: it uses the standard
library alone and the syntax of Python 3.7. It

- listens on the node's cluster address (never on all interfaces), on a free
  port of the operator's session range, and then moves itself into a user and
  network namespace of its own, where it starts the session's app (the command
  after ``--``): the app's 127.0.0.1 (``GPUPOOL_APP_HOST`` and
  ``GPUPOOL_APP_PORT``) is that namespace's, so no other job on the node,
  whatever its uid, can connect to it. A socket keeps the namespace it was made
  in: the listener stays on the node's network, and each connection the shim
  opens to the app is made inside the app's. A node that cannot make the
  namespaces (user.max_user_namespaces = 0, a seccomp or AppArmor rule) fails
  the session with exit code 78 and says why on stderr: the app is never left
  on the node's shared loopback;
- writes that port, and nothing else, into the port file the run-as helper
  made, once the app answers;
- lets a connection through only when its first request carries the
  session's secret in ``X-Gpupool-Session-Secret``, which only gpupool's
  proxy and this job know; any other caller (another tenant's job on the same
  node included) gets 403 and never reaches the app;
- relays the bytes between the proxy and the app in one hop, with splice(2)
  where the job's Python has it (3.10+): the kernel moves them, the
  interpreter only waits;
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
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

SECRET_HEADER = "x-gpupool-session-secret"
STATUS_PATH = "/.gpupool-shim/status"
MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CHUNK = 256 * 1024
# What one splice(2) moves at most: the pipe between the two sockets is made this large where the kernel allows.
PIPE_BYTES = 1024 * 1024
F_SETPIPE_SZ = 1031
SPLICE_F_MOVE = 1
REFUSAL_BODY = b"gpupool session: this session's secret is missing or wrong\n"
# EX_CONFIG: gpupool reads this exit code as "the node cannot keep the app private".
NO_PRIVATE_NETWORK_EXIT = 78
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
        sock.listen(128)
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


def _splice_relay(source: socket.socket, target: socket.socket, activity: Activity) -> None:
    """Move bytes socket -> pipe -> socket inside the kernel until the source ends: no copy through Python."""
    read_end, write_end = os.pipe()
    try:
        try:
            import fcntl

            fcntl.fcntl(write_end, F_SETPIPE_SZ, PIPE_BYTES)
        except (OSError, ImportError):
            pass  # a smaller pipe still works, in smaller steps
        src, dst = source.fileno(), target.fileno()
        while True:
            moved = os.splice(src, write_end, PIPE_BYTES, flags=SPLICE_F_MOVE)  # type: ignore[attr-defined]
            if moved == 0:
                return
            activity.touch()
            while moved:
                moved -= os.splice(read_end, dst, moved, flags=SPLICE_F_MOVE)  # type: ignore[attr-defined]
    finally:
        os.close(read_end)
        os.close(write_end)


def _copy_relay(source: socket.socket, target: socket.socket, activity: Activity) -> None:
    """The same for a Python without os.splice (before 3.10): one buffer, reused."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while True:
        count = source.recv_into(buffer)
        if not count:
            return
        target.sendall(view[:count])
        activity.touch()


_relay_impl = _splice_relay if hasattr(os, "splice") and sys.platform.startswith("linux") else _copy_relay


def relay(source: socket.socket, target: socket.socket, activity: Activity) -> None:
    try:
        _relay_impl(source, target, activity)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def has_body(headers: list[tuple[str, bytes]]) -> bool:
    """Whether the request goes on past its head: a body (Content-Length, chunked) or an upgraded connection."""
    for name, value in headers:
        if name == "transfer-encoding":
            return True
        if name == "content-length" and value.strip() not in (b"", b"0"):
            return True
    return False


class Shim:
    def __init__(self, secret: bytes, app_port: int, upstream_header: bytes | None, activity: Activity) -> None:
        self.secret = secret
        self.app_port = app_port
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
        # Made in this process's network namespace, the app's: its 127.0.0.1 is the app's alone.
        upstream = socket.create_connection(("127.0.0.1", self.app_port), timeout=10)
        upstream.settimeout(None)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            upstream.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + rest)
            self.activity.touch()
            if upgrade:
                self.activity.websocket(+1)
            try:
                if upgrade or has_body(headers):
                    onward = threading.Thread(target=relay, args=(conn, upstream, self.activity), daemon=True)
                    onward.start()
                    relay(upstream, conn, self.activity)
                    onward.join()
                else:
                    # A request with no body has nothing more to send: the answer is all there is to relay.
                    relay(upstream, conn, self.activity)
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
        os.unshare(flags)  # type: ignore[attr-defined]
        return
    import ctypes  # only here: an image's Python may lack it, and then this node cannot isolate the app

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def enter_private_network() -> None:
    """Move this process into a new user and network namespace whose loopback only it and its children share.

    The kernel allows a new user namespace to a single-threaded process only: this runs
    before any thread starts. Sockets made before it (the listener) stay on the node's
    network. The uid and gid map to themselves, so the app keeps the tenant's identity
    on files; the capabilities the new namespace grants go at the app's exec.
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


def install_stop(child: subprocess.Popen) -> list[int]:
    """Pass Slurm's SIGTERM (cancel, idle stop, time limit) on to the app; the shim ends when the app does.

    The handler only forwards: the main thread is in ``child.wait()``, whose lock a wait
    here could not take (that waited its whole timeout, 20 s, before every stop). An app
    that ignores the signal gets Slurm's SIGKILL after KillWait. The signals received go
    into the list returned, for the exit code.
    """
    received: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        received.append(signum)
        try:
            child.send_signal(signum)
        except OSError:
            pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return received


def write_port_file(path: str, port: int) -> None:
    # The run-as helper made this file (tenant:service 0640): write into it, never replace it.
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{port}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--ports", required=True, help="the operator's session port range, low-high")
    parser.add_argument("--secret-env", help="also give the app the secret in this environment variable")
    parser.add_argument("--upstream-header", help="a header added to each request to the app; {secret} is replaced")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the app's command after --")
    with open(args.secret_file, "rb") as handle:
        secret = handle.read().strip()
    if len(secret) < 32:
        print("gpupool session: the secret file holds no secret", file=sys.stderr)
        return 2
    low, high = parse_ports(args.ports)
    # On the node's network, before leaving it: the name resolves and the listener binds there.
    host = node_address()
    listener = listen_in_range(host, low, high)
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
    if args.secret_env:
        env[args.secret_env] = secret.decode()
    header = None
    if args.upstream_header:
        header = args.upstream_header.replace("{secret}", secret.decode()).encode("latin-1")
    app = subprocess.Popen(command, env=env)  # the listener is not inherited (Python's sockets are close-on-exec)
    stopped_by = install_stop(app)
    while not app_answers(app_port):
        if app.poll() is not None:
            if stopped_by:
                return 128 + stopped_by[0]
            print(f"gpupool session: the app exited with {app.returncode} before it answered", file=sys.stderr)
            return app.returncode or 1
        time.sleep(0.2)
    shim = Shim(secret, app_port, header, Activity())
    threading.Thread(target=shim.serve, args=(listener,), daemon=True).start()
    write_port_file(args.port_file, listener.getsockname()[1])
    print(f"gpupool session: listening on {host}:{listener.getsockname()[1]}", flush=True)
    code = app.wait()
    return 128 + stopped_by[0] if stopped_by else code


if __name__ == "__main__":
    sys.exit(main())
