"""Webhooks: events recorded with the job states they announce, delivered by one sender.

The refresher notes each job before it applies Slurm's answer and enqueues
``job.started`` / ``job.preempted`` / ``job.ended`` events, with one delivery row per endpoint
that wants them, in the same transaction as the new state: an event exists
exactly when its state change was stored. ``gpupool webhooks run`` (one per
cluster) sends them; nothing in a request or in the refresher waits on a
receiver.

Deliveries are at least once: each carries the event's ``id`` for the
receiver to deduplicate, and a failed one is retried with exponential
backoff until the event is ``webhook_retry_window_s`` old. Bodies are signed
like Stripe's: ``Gpupool-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t.body">``.

Receivers are checked twice against server-side request forgery: when the
URL is registered and before every attempt, after resolving the name; the
connection then goes to the address that was checked (so a name cannot
re-resolve elsewhere in between), redirects are never followed, and answers
are read only up to a cap. IPv6 forms that embed an IPv4 address (mapped,
compatible, NAT64) are refused whatever that address is.

A receiver cannot hold the sender: each attempt has one deadline for all of
it (``webhook_timeout_s``; its sockets are shut down then), attempts run in a
bounded pool of threads, and one account's endpoints take at most
``webhook_concurrency_per_account`` of its slots.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import ssl
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpupool.clock import utc_text
from gpupool.config import Network, Settings, allowed_networks
from gpupool.db import utcnow
from gpupool.errors import WebhookUrlRefused
from gpupool.models import Job, LedgerEntry
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

log = logging.getLogger("gpupool.webhooks")

JOB_STARTED = "job.started"
JOB_ENDED = "job.ended"
# A spot job's run was preempted by a full-price job: it is requeued and runs again later.
JOB_PREEMPTED = "job.preempted"
# Every GPU of a running job stayed under its idle policy's threshold for the policy's window
# (gpupool.gpu_usage.idle); sent once per idle spell, by `gpupool idle check`.
JOB_IDLE = "job.idle"
# What a job's callback_url hears: the events about that job.
JOB_EVENT_TYPES = (JOB_STARTED, JOB_ENDED, JOB_PREEMPTED, JOB_IDLE)
# About an account, not a job: a billing pass crossed a spend threshold, or forecasts the
# budget's end at the last 24 hours' rate (billing.alerts).
BUDGET_THRESHOLD = "budget.threshold"
BUDGET_FORECAST = "budget.forecast"
ACCOUNT_EVENT_TYPES = (BUDGET_THRESHOLD, BUDGET_FORECAST)
# Every type an endpoint may ask for; api.schemas.WebhookEventType spells the same list for pydantic.
EVENT_TYPES = JOB_EVENT_TYPES + ACCOUNT_EVENT_TYPES
_PREEMPTED = "PREEMPTED"
SIGNATURE_HEADER = "Gpupool-Signature"
MAX_BACKOFF_S = 3600.0
RESPONSE_EXCERPT_CHARS = 1024
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def new_secret() -> str:
    return "whsec_" + secrets.token_hex(32)


def url_origin(url: str) -> str:
    """scheme://host[:port] of a receiver's URL: its path and query may hold the receiver's own secret (Slack's do)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{shown}" + (f":{parts.port}" if parts.port else "")


def signature_header(body: bytes, secret: str, timestamp: int) -> str:
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


# IPv6 forms that carry an IPv4 address and reach it: IPv4-mapped (a dual-stack socket
# connects to the IPv4 host), IPv4-translated (SIIT), IPv4-compatible (deprecated, still
# routed by some stacks) and NAT64 (the well-known and the local-use prefix: a NAT64
# gateway forwards to the embedded address, which may be 10.0.0.1 or 169.254.169.254).
# Refused whatever the embedded address: no receiver needs them, and judging the
# embedded address would mean trusting every translator on the path to map it faithfully.
EMBEDDED_IPV4_NETWORKS: tuple[ipaddress.IPv6Network, ...] = tuple(
    ipaddress.IPv6Network(cidr) for cidr in ("::ffff:0:0/96", "::ffff:0:0:0/96", "::/96", "64:ff9b::/96", "64:ff9b:1::/48")
)


def _address_allowed(address: Address, allow: Sequence[Network]) -> bool:
    if any(address in network for network in allow):
        return True  # an operator's allowlist names exact networks, translated ones included
    if isinstance(address, ipaddress.IPv6Address) and any(address in network for network in EMBEDDED_IPV4_NETWORKS):
        return False
    # Not global: loopback, private, link-local (169.254.169.254, the cloud metadata
    # service, among them), shared, reserved, multicast and unspecified addresses.
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class Destination:
    """A receiver URL and the addresses its host resolved to, every one of them allowed."""

    url: str
    scheme: str
    host: str
    port: int
    target: str  # path and query
    addresses: tuple[Address, ...]

    def pinned_url(self) -> str:
        address = self.addresses[0]
        literal = f"[{address}]" if address.version == 6 else str(address)
        return f"{self.scheme}://{literal}:{self.port}{self.target}"

    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def check_destination(url: str, allow: Sequence[Network]) -> Destination:
    """Resolve ``url``'s host and refuse it unless every address is public or allowlisted; sends nothing."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL" and the like: not a URL at all
        raise WebhookUrlRefused(f"the webhook URL is not a valid URL: {exc}", errors=[{"field": "url", "message": "not a URL"}]) from exc
    if parts.scheme not in ("http", "https"):
        raise WebhookUrlRefused("a webhook URL must start with https:// or http://", errors=[{"field": "url", "message": "not http(s)"}])
    if not parts.hostname:
        raise WebhookUrlRefused("the webhook URL has no host", errors=[{"field": "url", "message": "no host"}])
    if parts.username or parts.password:
        raise WebhookUrlRefused(
            "put no credentials in a webhook URL; verify the Gpupool-Signature header instead",
            errors=[{"field": "url", "message": "credentials in the URL"}],
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise WebhookUrlRefused("the webhook URL's port is not a number from 1 to 65535", errors=[{"field": "url", "message": "bad port"}]) from exc
    host = parts.hostname
    try:
        addresses: tuple[Address, ...] = (ipaddress.ip_address(host),)
    except ValueError:
        try:
            answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise WebhookUrlRefused(
                f"the webhook host {host!r} does not resolve", errors=[{"field": "url", "message": "does not resolve"}]
            ) from exc
        addresses = tuple(dict.fromkeys(ipaddress.ip_address(str(answer[4][0]).split("%")[0]) for answer in answers))
    refused = [address for address in addresses if not _address_allowed(address, allow)]
    if refused or not addresses:
        raise WebhookUrlRefused(
            f"the webhook host {host!r} is at {refused[0] if refused else 'no address'}: loopback, private, link-local "
            "and metadata addresses are not sent to (ask the operator to allowlist a network)",
            errors=[{"field": "url", "message": "address not allowed"}],
        )
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Destination(url=url, scheme=parts.scheme, host=host, port=port, target=target, addresses=addresses)


def _timestamp(value: dt.datetime | None) -> str | None:
    # "auto": microseconds where the moment has them, as payloads have always carried.
    return None if value is None else utc_text(value, timespec="auto")


def _job_payload(session: Session, job: Job, event_type: str) -> dict[str, Any]:
    gpu_seconds = None
    if event_type == JOB_ENDED:
        # Billed only if a billing pass has already run since the end; usually not yet.
        gpu_seconds = session.scalar(select(func.sum(LedgerEntry.gpu_seconds)).where(LedgerEntry.gpupool_job_id == job.id))
    return {
        "job_id": job.id,
        "account": job.account,
        "name": job.name,
        "template": job.template,
        "state": job.state,
        "slurm_job_id": job.slurm_job_id,
        "gpus": job.gpus,
        "gpu_type": job.gpu_type,
        "node": job.node,
        "submitted_at": _timestamp(job.submitted_at),
        "started_at": _timestamp(job.started_at),
        "ended_at": _timestamp(job.ended_at),
        "exit_code": job.exit_code,
        "exit_signal": job.exit_signal,
        "elapsed_s": job.elapsed_s,
        "end_reason": job.end_reason,
        "preemptible": job.preemptible,
        "run_count": job.run_count,
        "gpu_seconds": None if gpu_seconds is None else int(gpu_seconds),
    }


def _preempted(job: Job) -> bool:
    """A spot job between runs: preempted, requeued, not yet running again (gpupool.jobstate)."""
    return job.state == _PREEMPTED and not job.finished


@dataclass(frozen=True)
class _Before:
    """A job as the refresher found it, before Slurm's answer was applied."""

    job: Job
    started: bool
    finished: bool
    preempted: bool
    runs: int

    def events(self) -> list[str]:
        """What happened since, in order."""
        job = self.job
        happened: list[str] = []
        if self.started and job.started_at is not None and (job.run_count or 0) > self.runs:
            # Requeued and started again between two refreshes, so PREEMPTED was never seen:
            # each run still gets its job.started, and a spot job's requeue its job.preempted.
            if job.preemptible and not self.preempted:
                happened.append(JOB_PREEMPTED)
            happened.append(JOB_STARTED)
        for event_type, now_true, before in (
            (JOB_STARTED, job.started_at is not None, self.started),
            (JOB_PREEMPTED, _preempted(job), self.preempted),
            (JOB_ENDED, job.finished, self.finished),
        ):
            if now_true and not before:
                happened.append(event_type)
        return happened


class JobEvents:
    """What the refresher changed: ``note`` each job before applying Slurm's answer, ``enqueue`` after."""

    def __init__(self) -> None:
        self._before: list[_Before] = []

    def note(self, job: Job) -> None:
        self._before.append(_Before(job, job.started_at is not None, job.finished, _preempted(job), job.run_count or 0))

    def enqueue(self, session: Session, now: dt.datetime) -> int:
        """Add the events and their deliveries to ``session``'s transaction; how many events."""
        happened = [(before.job, event_type) for before in self._before for event_type in before.events()]
        if not happened:
            return 0  # the usual case: no query at all
        accounts = {job.account for job, _ in happened}
        job_ids = {job.id for job, _ in happened}
        endpoints = session.scalars(
            select(WebhookEndpoint).where(
                WebhookEndpoint.account.in_(accounts),
                WebhookEndpoint.deleted_at.is_(None),
                WebhookEndpoint.job_id.is_(None) | WebhookEndpoint.job_id.in_(job_ids),
            )
        ).all()
        owed: list[tuple[str, WebhookEndpoint]] = []
        for job, event_type in happened:
            wanting = [e for e in endpoints if e.account == job.account and e.job_id in (None, job.id) and e.wants(event_type)]
            if not wanting:
                continue
            event_id = f"evt_{uuid.uuid4().hex}"
            payload = {"id": event_id, "type": event_type, "created_at": _timestamp(now), "data": {"job": _job_payload(session, job, event_type)}}
            session.add(WebhookEvent(id=event_id, account=job.account, job_id=job.id, type=event_type, payload=payload, created_at=now))
            owed.extend((event_id, endpoint) for endpoint in wanting)
        # The models declare no relationships, so the events go in first, by hand, for the deliveries' foreign key.
        session.flush()
        session.add_all(
            WebhookDelivery(event_id=event_id, endpoint_id=endpoint.id, state=PENDING, attempts=0, next_attempt_at=now)
            for event_id, endpoint in owed
        )
        return len({event_id for event_id, _ in owed})


def enqueue_job_event(session: Session, job: Job, event_type: str, now: dt.datetime, data: dict[str, Any]) -> int:
    """One event about ``job`` (its payload's ``job`` plus ``data``) for each endpoint that wants it; how many deliveries.

    In the caller's transaction, as ``JobEvents.enqueue`` does for the refresher's events.
    """
    wanting = [
        endpoint
        for endpoint in session.scalars(
            select(WebhookEndpoint).where(
                WebhookEndpoint.account == job.account,
                WebhookEndpoint.deleted_at.is_(None),
                WebhookEndpoint.job_id.is_(None) | (WebhookEndpoint.job_id == job.id),
            )
        )
        if endpoint.wants(event_type)
    ]
    if not wanting:
        return 0
    event_id = f"evt_{uuid.uuid4().hex}"
    payload = {
        "id": event_id, "type": event_type, "created_at": _timestamp(now),
        "data": {"job": _job_payload(session, job, event_type), **data},
    }
    session.add(WebhookEvent(id=event_id, account=job.account, job_id=job.id, type=event_type, payload=payload, created_at=now))
    session.flush()  # the event before its deliveries' foreign key
    session.add_all(
        WebhookDelivery(event_id=event_id, endpoint_id=endpoint.id, state=PENDING, attempts=0, next_attempt_at=now)
        for endpoint in wanting
    )
    return len(wanting)


@dataclass(frozen=True)
class Claimed:
    delivery_id: int
    account: str
    url: str
    secret: str
    endpoint_deleted: bool
    body: bytes
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


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport on a pool that opens every connection through ``_DeadlineBackend``."""

    def __init__(self) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            # One fresh connection per attempt, so each is watched by its own attempt's deadline.
            max_keepalive_connections=0,
            network_backend=_DeadlineBackend(),
        )


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
        self._http = httpx.Client(
            timeout=httpx.Timeout(settings.webhook_timeout_s),
            follow_redirects=False,  # a redirect could point anywhere: it counts as a failed attempt
            trust_env=False,  # no proxy from the environment: the checked address is the one connected to
            transport=transport if transport is not None else _DeadlineTransport(),
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
            if busy:
                query = query.where(WebhookEndpoint.account.not_in(busy))
            claimed = []
            for delivery, endpoint in session.execute(query).all():
                if in_flight[endpoint.account] >= share:
                    continue  # left due, unclaimed: the next free slot of its account takes it
                in_flight[endpoint.account] += 1
                delivery.next_attempt_at = now + self._claim_for
                event = session.get(WebhookEvent, delivery.event_id)
                assert event is not None  # foreign key
                claimed.append(
                    Claimed(
                        delivery_id=delivery.id, account=endpoint.account, url=endpoint.url, secret=endpoint.secret,
                        endpoint_deleted=endpoint.deleted_at is not None, body=event_body(event.payload),
                        event_id=event.id, event_type=event.type, event_created_at=event.created_at,
                    )
                )
            return claimed

    def _attempt(self, item: Claimed) -> Outcome:
        """One POST, over by ``webhook_timeout_s`` from its start whatever the receiver does. Runs in a pool thread."""
        started = time.monotonic()
        deadline = AttemptDeadline(self._settings.webhook_timeout_s)
        _current_deadline.value = deadline
        try:
            return self._post(item, deadline, started)
        finally:
            _current_deadline.value = None
            deadline.cancel()

    def _post(self, item: Claimed, deadline: AttemptDeadline, started: float) -> Outcome:
        def outcome(ok: bool, status: int | None, error: str | None, excerpt: str | None = None) -> Outcome:
            if deadline.passed:
                ok, error = False, f"no complete answer within the {deadline.seconds:g} s deadline"
            return Outcome(ok, status, error, excerpt, int((time.monotonic() - started) * 1000))

        try:
            # Again: DNS may have changed since registration. The resolver's own timeouts bound this.
            destination = check_destination(item.url, self._allow)
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


def add_job_callback(settings: Settings, session: Session, job: Job, url: str) -> WebhookEndpoint:
    """A submit's ``callback_url``: an endpoint for this job alone, added to the job row's transaction."""
    check_destination(url, allowed_networks(settings.webhook_allow_cidrs, "webhook_allow_cidrs"))
    endpoint = WebhookEndpoint(
        id=str(uuid.uuid4()), account=job.account, job_id=job.id, url=url, events=",".join(JOB_EVENT_TYPES),
        secret=new_secret(), created_at=utcnow(),
    )
    session.add(endpoint)
    return endpoint


def job_callback_secret(session: Session, job_id: str) -> str | None:
    return session.scalar(select(WebhookEndpoint.secret).where(WebhookEndpoint.job_id == job_id))
