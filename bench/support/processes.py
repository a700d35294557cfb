"""The processes a bench starts and watches: started in a group of their own, waited for, measured from /proc."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# Debian's nginx, which the benches and tests run as a stand-in front end (make venv-test installs nginx-light).
NGINX = "/usr/sbin/nginx"


@contextmanager
def process(argv: list[str], **kwargs: object) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running in a session of its own for the block; its whole group ended afterwards (TERM, then KILL)."""
    child = subprocess.Popen(argv, start_new_session=True, **kwargs)  # type: ignore[call-overload]
    try:
        yield child
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    """Until ``check()`` is true; the bench ends with a message naming ``what`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f"{Path(sys.argv[0]).stem}: {what} did not come up within {timeout_s:.0f} s")
        time.sleep(0.1)


def answers(port: int) -> bool:
    """Whether something accepts connections on the loopback port."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system, all threads) a process has used; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The process's direct children (its main thread's)."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
