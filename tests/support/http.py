"""What only the tests use of HTTP: a stdlib server they serve, and the API's error shape."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from werkzeug.test import TestResponse


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps the test's output clean."""

    def log_message(self, *_args: object) -> None:
        pass


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1") -> Iterator[int]:
    """Serves ``handler`` on ``host`` at a free port, in a thread, until the block ends; yields the port."""
    server = ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def assert_error(response: TestResponse, status: int, code: str | None = None) -> dict[str, Any]:
    """The API's one error shape, ``{"error": ..., "message": ...}``, with this status (and code); the body."""
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) >= {"error", "message"}
    assert body["message"]
    if code is not None:
        assert body["error"] == code
    return body
