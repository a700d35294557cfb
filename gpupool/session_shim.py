"""The authenticating front of an interactive session, run inside the tenant's job.

gpupool writes this file into a session job's folder and runs it there, in
whatever Python the job's environment or image has: it uses the standard
library alone and the syntax of Python 3.7. It

- starts the session's app (the command after ``--``) on 127.0.0.1 and a port
  of its own, given to the app as ``GPUPOOL_APP_PORT``;
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
import signal
import socket
import subprocess
import sys
import threading
import time

SECRET_HEADER = "x-gpupool-session-secret"
STATUS_PATH = "/.gpupool-shim/status"
MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CHUNK = 64 * 1024
REFUSAL_BODY = b"gpupool session: this session's secret is missing or wrong\n"


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
        upstream = socket.create_connection(("127.0.0.1", self.app_port), timeout=10)
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
    host = node_address()
    listener = listen_in_range(host, low, high)
    app_port = free_loopback_port()
    env = dict(os.environ, GPUPOOL_APP_HOST="127.0.0.1", GPUPOOL_APP_PORT=str(app_port))
    if args.secret_env:
        env[args.secret_env] = secret.decode()
    header = None
    if args.upstream_header:
        header = args.upstream_header.replace("{secret}", secret.decode()).encode("latin-1")
    app = subprocess.Popen(command, env=env)

    def stop(signum: int, _frame: object) -> None:
        # Slurm's SIGTERM at cancel, idle stop or time limit: the app first, then this process.
        app.send_signal(signum)
        try:
            app.wait(timeout=20)
        except subprocess.TimeoutExpired:
            app.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not app_answers(app_port):
        if app.poll() is not None:
            print(f"gpupool session: the app exited with {app.returncode} before it answered", file=sys.stderr)
            return app.returncode or 1
        time.sleep(0.5)
    shim = Shim(secret, app_port, header, Activity())
    threading.Thread(target=shim.serve, args=(listener,), daemon=True).start()
    write_port_file(args.port_file, listener.getsockname()[1])
    print(f"gpupool session: listening on {host}:{listener.getsockname()[1]}", flush=True)
    return app.wait()


if __name__ == "__main__":
    sys.exit(main())
