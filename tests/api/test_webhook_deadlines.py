"""A receiver that trickles its answer is cut off at the deadline, and delays no other account's delivery.

Real jobs on the cluster make the events; the receivers are this test's own
sockets on 127.0.0.1. Every assertion is on what was recorded (the attempts'
outcomes and order, what each receiver saw happen first), not on elapsed time.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from gpupool.webhooks.sender import WebhookSender
from tests.conftest import bearer, wait_for, wait_for_state

HELLO = {"template": "hello", "gpus": 1, "params": {"seconds": 0}}
DEADLINE_S = 3.0
# One byte every TRICKLE_GAP_S: far under any per-read timeout, so only a deadline on the whole attempt stops it.
TRICKLE_GAP_S = 0.25
TRICKLED = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 40\r\n\r\n" + b"x" * 40
QUICK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


@dataclass
class Timeline:
    """What the receivers saw, in the order they saw it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        with self.lock:
            self.seen.append(what)

    def has(self, what: str) -> bool:
        with self.lock:
            return what in self.seen


def read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = conn.recv(4096)
        if not chunk:
            return
        body += chunk


def answer_trickling(name: str, timeline: Timeline, conn: socket.socket) -> None:
    for index in range(len(TRICKLED)):
        time.sleep(TRICKLE_GAP_S)
        try:
            conn.sendall(TRICKLED[index : index + 1])
        except OSError:
            timeline.note(f"{name}:cut")  # the sender hung up on us
            return
    timeline.note(f"{name}:answered")


def answer_quickly(_name: str, _timeline: Timeline, conn: socket.socket) -> None:
    conn.sendall(QUICK)


Answer = Callable[[str, Timeline, socket.socket], None]


@pytest.fixture
def timeline() -> Timeline:
    return Timeline()


@pytest.fixture
def serve(timeline: Timeline) -> Iterator[Callable[[str, Answer], str]]:
    """Start a receiver on 127.0.0.1 answering each request with ``answer``; its URL."""
    listeners: list[socket.socket] = []

    def start(name: str, answer: Answer) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def loop() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return  # closed at teardown
                with conn:
                    read_request(conn)
                    timeline.note(f"{name}:request")
                    answer(name, timeline, conn)

        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}/hook"

    yield start
    for listener in listeners:
        listener.close()


@pytest.fixture
def settings(session_settings: Settings, templates_dir: Path) -> Settings:
    return session_settings.replace(
        templates_dir=str(templates_dir), webhook_allow_cidrs=("127.0.0.0/8",), webhook_timeout_s=DEADLINE_S,
        webhook_backoff_s=3600.0,  # no retry within the test
    )


@pytest.fixture
def sender(session_factory: sessionmaker, settings: Settings) -> Iterator[WebhookSender]:
    webhook_sender = WebhookSender(session_factory, settings)
    yield webhook_sender
    webhook_sender.close()


def register(client: FlaskClient, headers: dict[str, str], url: str) -> str:
    reply = client.post("/webhooks", json={"url": url, "events": ["job.ended"]}, headers=headers)
    assert reply.status_code == 201, reply.get_json()
    return str(reply.get_json()["id"])


def run_a_job(client: FlaskClient, headers: dict[str, str]) -> None:
    reply = client.post("/submit", json=HELLO, headers=headers)
    assert reply.status_code == 201, reply.get_json()
    wait_for_state(client, reply.get_json()["job_id"], headers, {"COMPLETED"})


def attempts_in_order(session_factory: sessionmaker) -> list[tuple[str, int | None, str | None]]:
    with session_factory() as session:
        rows = session.execute(
            select(WebhookEndpoint.account, WebhookAttempt.status_code, WebhookAttempt.error)
            .join(WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id)
            .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            .order_by(WebhookAttempt.id)
        ).all()
    return [(row.account, row.status_code, row.error) for row in rows]


def test_a_trickling_receiver_is_cut_off_and_delays_no_other_account(
    client: FlaskClient, auth: dict[str, str], account: str, other_account: str, settings: Settings,
    sender: WebhookSender, session_factory: sessionmaker, serve: Callable[[str, Answer], str], timeline: Timeline,
) -> None:
    other = bearer(settings, other_account, sub="bob")
    slow_endpoint = register(client, auth, serve("slow", answer_trickling))
    quick_endpoint = register(client, other, serve("quick", answer_quickly))
    run_a_job(client, auth)  # the slow receiver's event is due first
    run_a_job(client, other)

    assert sender.run_once() == 2
    wait_for(lambda: timeline.has("slow:cut") or timeline.has("slow:answered"), what="the slow receiver to finish or be cut")

    # The quick receiver had its event while the slow one was still trickling, and the slow one never finished.
    assert timeline.seen.index("quick:request") < timeline.seen.index("slow:cut")
    assert "slow:answered" not in timeline.seen
    # Recorded as they ended: the quick delivery first, then the slow one, failed at the deadline.
    assert attempts_in_order(session_factory) == [
        (other_account, 200, None),
        (account, None, f"no complete answer within the {DEADLINE_S:g} s deadline"),
    ]
    (slow,) = client.get(f"/webhooks/{slow_endpoint}/deliveries", headers=auth).get_json()["deliveries"]
    assert slow["state"] == "pending"  # retried later, at least once as promised
    (quick,) = client.get(f"/webhooks/{quick_endpoint}/deliveries", headers=other).get_json()["deliveries"]
    assert quick["state"] == "delivered"


def test_one_accounts_slow_receivers_hold_only_its_own_share_of_the_senders_slots(
    client: FlaskClient, auth: dict[str, str], account: str, other_account: str, settings: Settings,
    session_factory: sessionmaker, serve: Callable[[str, Answer], str], timeline: Timeline,
) -> None:
    # Two slots, one per account at most: the slow account's two receivers cannot take both.
    fair = WebhookSender(session_factory, settings.replace(webhook_concurrency=2, webhook_concurrency_per_account=1))
    other = bearer(settings, other_account, sub="bob")
    register(client, auth, serve("slow1", answer_trickling))
    register(client, auth, serve("slow2", answer_trickling))
    register(client, other, serve("quick", answer_quickly))
    run_a_job(client, auth)  # both slow deliveries are due before the quick one
    run_a_job(client, other)

    try:
        assert fair.run_once() == 3
    finally:
        fair.close()
    wait_for(lambda: sum(timeline.has(f"slow{n}:cut") or timeline.has(f"slow{n}:answered") for n in (1, 2)) == 2, what="both slow receivers")

    first_cut = min(timeline.seen.index(f"slow{n}:cut") for n in (1, 2))
    assert timeline.seen.index("quick:request") < first_cut
    # Recorded as they ended: without the per-account share the quick one would wait for a slow one's slot.
    deadline_error = f"no complete answer within the {DEADLINE_S:g} s deadline"
    assert attempts_in_order(session_factory) == [
        (other_account, 200, None),
        (account, None, deadline_error),
        (account, None, deadline_error),
    ]

