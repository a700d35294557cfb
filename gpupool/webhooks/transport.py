"""An httpx transport whose every attempt ends by one deadline, whatever the receiver does.

httpx's own timeouts bound each read, so a receiver sending a byte every few
seconds never trips them. Here each connection an attempt opens (inside
``attempt_deadline``) waits at most until that attempt's deadline, and its
socket is shut down then, which ends any wait at once.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx


class AttemptDeadline:
    """One attempt's end: every socket it opened is shut down then, whatever it was waiting on.

    httpx's timeouts bound each read, so a receiver sending a byte every few
    seconds never trips them; shutting the socket down from a timer ends any
    wait at once (a TLS handshake's several reads included).
    """

    def __init__(self, seconds: float) -> None:
        self.ends_at = time.monotonic() + seconds
        self.seconds = seconds
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._passed = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    @property
    def passed(self) -> bool:
        return self._passed or time.monotonic() >= self.ends_at

    def remaining(self) -> float:
        return max(0.0, self.ends_at - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._passed:
                self._sockets.append(sock)
                return
        _shut(sock)

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self._passed = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread; close() would not
    except OSError:
        pass  # already closed by its owner


_current_deadline = threading.local()


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation waits at most until the attempt's deadline."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: AttemptDeadline) -> None:
        self._inner = inner
        self._deadline = deadline

    def _cap(self, timeout: float | None) -> float:
        remaining = self._deadline.remaining()
        if remaining <= 0:
            raise httpcore.ReadTimeout("the attempt's deadline passed")
        return remaining if timeout is None else min(timeout, remaining)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._cap(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._cap(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None) -> httpcore.NetworkStream:
        wrapped = self._inner.start_tls(ssl_context, server_hostname, self._cap(timeout))
        return _DeadlineStream(wrapped, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.SyncBackend):
    """Connections of the attempt running in this thread, each bound to that attempt's deadline."""

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        deadline: AttemptDeadline | None = getattr(_current_deadline, "value", None)
        if deadline is None:
            return super().connect_tcp(host, port, timeout, local_address, socket_options)
        remaining = deadline.remaining()
        if remaining <= 0:
            raise httpcore.ConnectTimeout("the attempt's deadline passed")
        stream = super().connect_tcp(host, port, remaining if timeout is None else min(timeout, remaining), local_address, socket_options)
        deadline.watch(stream.get_extra_info("socket"))
        return _DeadlineStream(stream, deadline)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport on a pool that opens every connection through ``_DeadlineBackend``."""

    def __init__(self) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            # One fresh connection per attempt, so each is watched by its own attempt's deadline.
            max_keepalive_connections=0,
            network_backend=_DeadlineBackend(),
        )



@contextmanager
def attempt_deadline(seconds: float) -> Iterator[AttemptDeadline]:
    """A deadline for the attempt this thread makes inside the block: its connections are bound to it."""
    deadline = AttemptDeadline(seconds)
    _current_deadline.value = deadline
    try:
        yield deadline
    finally:
        _current_deadline.value = None
        deadline.cancel()
