"""What receives gpupool's notices: a customer's webhook receiver, the operator's SMTP server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from tests.support.http import QuietHandler, serving


@dataclass(frozen=True)
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookReceiver:
    """What a customer's receiver got; each path answers the statuses queued in ``scripted``, then 200."""

    base: str
    deliveries: list[Delivery] = field(default_factory=list)
    scripted: dict[str, list[int]] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base + "/hook"

    def at(self, path: str) -> list[Delivery]:
        return [delivery for delivery in self.deliveries if delivery.path == path]


@contextmanager
def serve_webhooks(host: str = "127.0.0.1") -> Iterator[WebhookReceiver]:
    """Listens on ``host`` (any free port) until the block ends; ``url`` is its /hook, ``base`` takes any path."""
    lock = threading.Lock()
    state = WebhookReceiver(base="")

    class Handler(QuietHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                state.deliveries.append(Delivery(self.path, dict(self.headers), body))
                queued = state.scripted.get(self.path, [])
                status = queued.pop(0) if queued else 200
            if self.path in state.redirects:
                self.send_response(302)
                self.send_header("Location", state.redirects[self.path])
            else:
                self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    with serving(Handler, host) as port:
        state.base = f"http://{host}:{port}"
        yield state


class MailInbox:
    """aiosmtpd's handler and authenticator: keeps every message and every login (and accepts any)."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.logins: list[tuple[bytes, bytes]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's hook name
        self.messages.append(envelope)
        return "250 OK"

    def __call__(self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> AuthResult:
        self.logins.append((auth_data.login, auth_data.password))
        return AuthResult(success=True)

    def to(self, recipient: str) -> list[Any]:
        return [envelope for envelope in self.messages if recipient in envelope.rcpt_tos]


@contextmanager
def serve_smtp(host: str, port: int) -> Iterator[MailInbox]:
    """An SMTP server on ``host``:``port`` that asks for a login but no TLS, until the block ends."""
    inbox = MailInbox()
    controller = Controller(inbox, hostname=host, port=port, authenticator=inbox, auth_require_tls=False)
    controller.start()
    try:
        yield inbox
    finally:
        controller.stop()
