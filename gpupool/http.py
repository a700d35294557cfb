"""The one way gpupool's own processes ask another server something over HTTP: httpx.

Reads from the cluster's own servers (a node's GPU exporter, a session's shim)
go through ``fetch``: no proxy from the environment, a timeout on the connect
and on every read, and an answer read only up to a bound, so a server that talks
forever costs one bound, not the process's memory. The webhook sender builds
its own httpx client on the same library (gpupool.webhooks.transport), since it pins
the address it checked and carries its own deadline. The session shim, which
runs inside a tenant's job with nothing but Python's standard library, is the
one exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import httpx


class FetchFailed(Exception):
    """No answer: a refused or dropped connection, a timeout, or an answer past its bound."""


@dataclass(frozen=True)
class Fetched:
    status: int
    body: bytes


def fetch(url: str, *, timeout_s: float, max_bytes: int, headers: Mapping[str, str] | None = None) -> Fetched:
    """GET ``url``; FetchFailed when no whole answer of at most ``max_bytes`` came, each step within ``timeout_s``."""
    try:
        # trust_env=False: cluster-internal servers, never through an operator's HTTP proxy.
        with httpx.Client(timeout=timeout_s, trust_env=False, follow_redirects=False) as client:
            with client.stream("GET", url, headers=dict(headers or {})) as response:
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise FetchFailed(f"{url}: answer larger than {max_bytes} bytes")
                return Fetched(response.status_code, bytes(body))
    except httpx.HTTPError as exc:
        raise FetchFailed(f"{url}: {exc or type(exc).__name__}") from exc
