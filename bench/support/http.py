"""A stdlib HTTP client for servers the tests and benches start, a free port, counted Slurm calls."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.support.tenancy import ensure_service_user

SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "sacctmgr")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any


def http(method: str, url: str, *, token: str | None = None, body: Any = None, headers: dict[str, str] | None = None, timeout_s: float = 30) -> Reply:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw, status, got = response.read(), response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        raw, status, got = exc.read(), exc.code, dict(exc.headers)
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        parsed = raw.decode(errors="replace")
    return Reply(status, got, parsed)


def as_service_user_argv() -> list[str]:
    """Run as the service user with no way to gain privileges, as NoNewPrivileges=yes does."""
    user = ensure_service_user()
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--no-new-privs", "--"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def counting_bin_dir(root: Path) -> tuple[Path, Path]:
    """Wrappers that log each Slurm command run, then run the real one."""
    wrappers, calls = root / "slurm-bin", root / "slurm-calls.log"
    wrappers.mkdir()
    calls.touch()
    for command in SLURM_COMMANDS:
        wrapper = wrappers / command
        wrapper.write_text(f'#!/bin/sh\necho {command} >> "{calls}"\nexec /usr/bin/{command} "$@"\n')
        wrapper.chmod(0o755)
    return wrappers, calls


def slurm_calls(calls: Path, *commands: str) -> int:
    return sum(1 for line in calls.read_text().split() if line in commands)


def read_head(sock: socket.socket, buffer: bytearray) -> tuple[bytes, bytes]:
    """The answer's status line and headers, and the body bytes that came with them."""
    head = b""
    while b"\r\n\r\n" not in head:
        count = sock.recv_into(buffer)
        if not count:
            break
        head += bytes(buffer[:count])
    head, _, rest = head.partition(b"\r\n\r\n")
    return head, rest
