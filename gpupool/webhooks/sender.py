"""The webhook sender: claims due deliveries, signs and POSTs them, records each attempt. Run one per cluster.

Deliveries are at least once: each carries the event's ``id`` for the
receiver to deduplicate, and a failed one is retried with exponential
backoff until the event is ``webhook_retry_window_s`` old. Bodies are signed
like Stripe's: ``Gpupool-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t.body">``.

A receiver cannot hold the sender: each attempt has one deadline for all of
it (``webhook_timeout_s``, ``gpupool.webhooks.transport``), redirects are never
followed, answers are read only up to a cap, attempts run in a bounded pool
of threads, and one account's endpoints take at most
``webhook_concurrency_per_account`` of its slots.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings, allowed_networks
from gpupool.db import utcnow
from gpupool.errors import WebhookUrlRefused
from gpupool.models.webhooks import (
    CANCELLED,
    DELIVERED,
    FAILED,
    PENDING,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from gpupool.webhooks.destinations import check_destination, url_origin
from gpupool.webhooks.operator import OPERATOR_SHARE_KEY
from gpupool.webhooks.transport import AttemptDeadline, DeadlineTransport, attempt_deadline

# The package's name, as the sender's log lines have always carried it.
log = logging.getLogger("gpupool.webhooks")

SIGNATURE_HEADER = "Gpupool-Signature"
MAX_BACKOFF_S = 3600.0
RESPONSE_EXCERPT_CHARS = 1024


def signature_header(body: bytes, secret: str, timestamp: int) -> str:
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


@dataclass(frozen=True)
class Claimed:
    delivery_id: int
    account: str
    url: str
    secret: str
    endpoint_deleted: bool
    body: bytes
    # The operator's endpoint (no account): its URL is the site's setting, not a customer's choice.
    operator: bool
    event_id: str
    event_type: str
    event_created_at: dt.datetime


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status_code: int | None
    error: str | None
    excerpt: str | None
    duration_ms: int


def event_body(payload: dict[str, Any]) -> bytes:
    """The exact bytes sent and signed; the same for every attempt."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


class WebhookSender:
    """Claims due deliveries, POSTs them from a bounded pool of threads, records each attempt. Run one per cluster.

    Only the thread that calls ``run`` / ``run_once`` touches the database;
    the pool's threads only talk HTTP. Each attempt ends by ``webhook_timeout_s``
    whatever the receiver does, and one account's endpoints hold at most
    ``webhook_concurrency_per_account`` of the ``webhook_concurrency`` slots, so a
    slow receiver delays nobody else's deliveries.
    """

    def __init__(self, session_factory: sessionmaker, settings: Settings, *, transport: httpx.BaseTransport | None = None) -> None:
        self._sessions = session_factory
        self._settings = settings
        self._allow = allowed_networks(settings.webhook_allow_cidrs, "webhook_allow_cidrs")
        # The operator's own receiver may be on the site's network: every address is allowed for it,
        # still resolved once and pinned as any other.
        self._allow_operator = allowed_networks(("0.0.0.0/0", "::/0"), "operator_webhook_url")
        self._http = httpx.Client(
            timeout=httpx.Timeout(settings.webhook_timeout_s),
            follow_redirects=False,  # a redirect could point anywhere: it counts as a failed attempt
            trust_env=False,  # no proxy from the environment: the checked address is the one connected to
            transport=transport if transport is not None else DeadlineTransport(),
        )
        self._workers = ThreadPoolExecutor(max_workers=settings.webhook_concurrency, thread_name_prefix="gpupool-webhook")
        self._in_flight: dict[Future[Outcome], Claimed] = {}
        # Another sender (or this one, after a crash) may take a delivery again after this;
        # an attempt ends by webhook_timeout_s, resolving the name aside.
        self._claim_for = dt.timedelta(seconds=settings.webhook_timeout_s * 3 + 30)

    def close(self) -> None:
        self._record_finished(wait_all=True)
        self._workers.shutdown(wait=True)
        self._http.close()

    def run(self, *, stop: Callable[[], bool], idle_s: float = 1.0) -> None:
        while not stop():
            started = self._dispatch(self._settings.webhook_concurrency)
            recorded = self._record_finished()
            if started or recorded:
                continue
            if self._in_flight:
                # Wakes early when an attempt ends: its slot may take the next due delivery.
                wait(list(self._in_flight), timeout=idle_s, return_when=FIRST_COMPLETED)
            else:
                time.sleep(idle_s)
        self._record_finished(wait_all=True)

    def run_once(self, batch: int = 50) -> int:
        """Attempt every delivery that is due now (up to ``batch``), recording each as it ends; how many were attempted."""
        attempted = 0
        while attempted < batch:
            started = self._dispatch(batch - attempted)
            attempted += started
            if not self._in_flight:
                break
            if not started:
                wait(list(self._in_flight), return_when=FIRST_COMPLETED)
            self._record_finished()
        self._record_finished(wait_all=True)
        return attempted

    def _dispatch(self, most: int) -> int:
        """Claim due deliveries into free slots, within each account's share; how many were claimed."""
        taken = 0
        while taken < most:
            free = min(self._settings.webhook_concurrency - len(self._in_flight), most - taken)
            if free <= 0:
                break
            claimed = self._claim(free)
            if not claimed:
                break
            for item in claimed:
                if item.endpoint_deleted:
                    self._finish(item, None)
                else:
                    self._in_flight[self._workers.submit(self._attempt, item)] = item
            taken += len(claimed)
        return taken

    def _record_finished(self, *, wait_all: bool = False) -> int:
        if wait_all and self._in_flight:
            wait(list(self._in_flight))
        done = [future for future in self._in_flight if future.done()]
        for future in done:
            # In the order they ended: a slow attempt never holds up recording a quick one.
            item = self._in_flight.pop(future)
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - one odd receiver must not stop the sender
                log.exception("webhook %s to %s: the attempt itself failed", item.event_id, item.url)
                result = Outcome(False, None, f"{type(exc).__name__}: {exc}"[:500], None, 0)
            self._finish(item, result)
        return len(done)

    def _accounts_at_share(self) -> list[str]:
        counts = Counter(item.account for item in self._in_flight.values())
        return [account for account, count in counts.items() if count >= self._settings.webhook_concurrency_per_account]

    def _claim(self, most: int) -> list[Claimed]:
        now = utcnow()
        share = self._settings.webhook_concurrency_per_account
        in_flight = Counter(item.account for item in self._in_flight.values())
        busy = self._accounts_at_share()
        with self._sessions() as session, session.begin():
            query = (
                select(WebhookDelivery, WebhookEndpoint)
                .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
                .where(WebhookDelivery.state == PENDING, WebhookDelivery.next_attempt_at <= now)
                .order_by(WebhookDelivery.next_attempt_at)
                .limit(most)
                .with_for_update(skip_locked=True, of=WebhookDelivery)
            )
            busy_accounts = [account for account in busy if account != OPERATOR_SHARE_KEY]
            if busy_accounts:
                query = query.where(WebhookEndpoint.account.is_(None) | WebhookEndpoint.account.not_in(busy_accounts))
            if OPERATOR_SHARE_KEY in busy:
                query = query.where(WebhookEndpoint.account.is_not(None))
            claimed = []
            for delivery, endpoint in session.execute(query).all():
                operator = endpoint.account is None
                key = OPERATOR_SHARE_KEY if endpoint.account is None else endpoint.account
                if in_flight[key] >= share:
                    continue  # left due, unclaimed: the next free slot of its account takes it
                in_flight[key] += 1
                delivery.next_attempt_at = now + self._claim_for
                event = session.get(WebhookEvent, delivery.event_id)
                assert event is not None  # foreign key
                claimed.append(
                    Claimed(
                        delivery_id=delivery.id, account=key,
                        url=self._settings.operator_webhook_url if operator else endpoint.url,
                        secret=self._settings.operator_webhook_secret if operator else endpoint.secret,
                        endpoint_deleted=endpoint.deleted_at is not None, body=event_body(event.payload),
                        event_id=event.id, event_type=event.type, event_created_at=event.created_at, operator=operator,
                    )
                )
            return claimed

    def _attempt(self, item: Claimed) -> Outcome:
        """One POST, over by ``webhook_timeout_s`` from its start whatever the receiver does. Runs in a pool thread."""
        started = time.monotonic()
        with attempt_deadline(self._settings.webhook_timeout_s) as deadline:
            return self._post(item, deadline, started)

    def _post(self, item: Claimed, deadline: AttemptDeadline, started: float) -> Outcome:
        def outcome(ok: bool, status: int | None, error: str | None, excerpt: str | None = None) -> Outcome:
            if deadline.passed:
                ok, error = False, f"no complete answer within the {deadline.seconds:g} s deadline"
            return Outcome(ok, status, error, excerpt, int((time.monotonic() - started) * 1000))

        if item.operator and not (item.url and item.secret):
            # Retried as any failure: the operator may set it within the retry window.
            return Outcome(False, None, "operator_webhook_url and operator_webhook_secret are not set on the sender", None, 0)
        try:
            # Again: DNS may have changed since registration. The resolver's own timeouts bound this.
            destination = check_destination(item.url, self._allow_operator if item.operator else self._allow)
        except WebhookUrlRefused as exc:
            return Outcome(False, None, f"refused before sending: {exc.message}", None, int((time.monotonic() - started) * 1000))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "gpupool-webhooks/1",
            "Host": destination.host_header(),
            "Gpupool-Event-Id": item.event_id,
            "Gpupool-Event-Type": item.event_type,
            SIGNATURE_HEADER: signature_header(item.body, item.secret, int(time.time())),
        }
        extensions = {"sni_hostname": destination.host} if destination.scheme == "https" else {}
        status: int | None = None
        try:
            with self._http.stream("POST", destination.pinned_url(), content=item.body, headers=headers, extensions=extensions) as response:
                status = response.status_code
                answer = bytearray()
                for block in response.iter_bytes():
                    answer += block
                    if len(answer) >= self._settings.webhook_max_response_bytes or deadline.passed:
                        break  # the rest is never read: a receiver cannot make the sender download a flood
                excerpt = bytes(answer[:RESPONSE_EXCERPT_CHARS]).decode(errors="replace")
                if response.is_redirect:
                    return outcome(False, status, "redirects are not followed", excerpt)
                if response.is_success:
                    return outcome(True, status, None, excerpt)
                return outcome(False, status, f"HTTP {status}", excerpt)
        except httpx.HTTPError as exc:
            return outcome(False, status, f"{type(exc).__name__}: {exc}"[:500])

    def _finish(self, item: Claimed, result: Outcome | None) -> None:
        now = utcnow()
        with self._sessions() as session, session.begin():
            delivery = session.get(WebhookDelivery, item.delivery_id)
            assert delivery is not None
            if result is None:
                delivery.state = CANCELLED
                return
            delivery.attempts += 1
            session.add(
                WebhookAttempt(
                    delivery_id=delivery.id, attempted_at=now, duration_ms=result.duration_ms,
                    status_code=result.status_code, error=result.error, response_excerpt=result.excerpt,
                )
            )
            if result.ok:
                delivery.state, delivery.delivered_at = DELIVERED, now
                return
            backoff = min(MAX_BACKOFF_S, self._settings.webhook_backoff_s * 2 ** (delivery.attempts - 1))
            retry_at = now + dt.timedelta(seconds=backoff)
            if retry_at - item.event_created_at > dt.timedelta(seconds=self._settings.webhook_retry_window_s):
                delivery.state = FAILED
                log.warning("webhook %s to %s given up after %d attempts", item.event_id, url_origin(item.url), delivery.attempts)
            else:
                delivery.next_attempt_at = retry_at
