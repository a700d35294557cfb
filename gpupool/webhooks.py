"""Webhooks: events recorded with the job states they announce, delivered by one sender.

The refresher notes each job before it applies Slurm's answer and enqueues
``job.started`` / ``job.ended`` events, with one delivery row per endpoint
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
are read only up to a cap.
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
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpupool.config import Settings
from gpupool.db import utcnow
from gpupool.errors import ConfigError, WebhookUrlRefused
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
EVENT_TYPES = (JOB_STARTED, JOB_ENDED)
SIGNATURE_HEADER = "Gpupool-Signature"
MAX_BACKOFF_S = 3600.0
RESPONSE_EXCERPT_CHARS = 1024
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def new_secret() -> str:
    return "whsec_" + secrets.token_hex(32)


def signature_header(body: bytes, secret: str, timestamp: int) -> str:
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def allowed_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError as exc:
            raise ConfigError(f"webhook_allow_cidrs: {cidr!r} is not an address or network ({exc})") from exc
    return tuple(networks)


def _address_allowed(address: Address, allow: Sequence[Network]) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
    if any(address in network for network in allow):
        return True
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
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


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
        "gpu_seconds": None if gpu_seconds is None else int(gpu_seconds),
    }


class JobEvents:
    """What the refresher changed: ``note`` each job before applying Slurm's answer, ``enqueue`` after."""

    def __init__(self) -> None:
        self._before: list[tuple[Job, bool, bool]] = []

    def note(self, job: Job) -> None:
        self._before.append((job, job.started_at is not None, job.finished))

    def enqueue(self, session: Session, now: dt.datetime) -> int:
        """Add the events and their deliveries to ``session``'s transaction; how many events."""
        happened = [
            (job, event_type)
            for job, was_started, was_finished in self._before
            for event_type, now_true, before in ((JOB_STARTED, job.started_at is not None, was_started), (JOB_ENDED, job.finished, was_finished))
            if now_true and not before
        ]
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


@dataclass(frozen=True)
class Claimed:
    delivery_id: int
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


class WebhookSender:
    """Claims due deliveries, POSTs them, records each attempt. Run one per cluster."""

    def __init__(self, session_factory: sessionmaker, settings: Settings, *, transport: httpx.BaseTransport | None = None) -> None:
        self._sessions = session_factory
        self._settings = settings
        self._allow = allowed_networks(settings.webhook_allow_cidrs)
        self._http = httpx.Client(
            timeout=httpx.Timeout(settings.webhook_timeout_s),
            follow_redirects=False,  # a redirect could point anywhere: it counts as a failed attempt
            trust_env=False,  # no proxy from the environment: the checked address is the one connected to
            transport=transport,
        )
        # Another sender (or this one, after a crash) may take a delivery again after this.
        self._claim_for = dt.timedelta(seconds=settings.webhook_timeout_s * 3 + 30)

    def close(self) -> None:
        self._http.close()

    def run(self, *, stop: Callable[[], bool], idle_s: float = 1.0) -> None:
        while not stop():
            if self.run_once() == 0:
                time.sleep(idle_s)

    def run_once(self, batch: int = 50) -> int:
        """Attempt every delivery that is due now (up to ``batch``); how many were attempted."""
        claimed = self._claim(batch)
        for item in claimed:
            if item.endpoint_deleted:
                self._finish(item, None)
                continue
            self._finish(item, self._attempt(item))
        return len(claimed)

    def _claim(self, batch: int) -> list[Claimed]:
        now = utcnow()
        with self._sessions() as session, session.begin():
            deliveries = session.scalars(
                select(WebhookDelivery)
                .where(WebhookDelivery.state == PENDING, WebhookDelivery.next_attempt_at <= now)
                .order_by(WebhookDelivery.next_attempt_at)
                .limit(batch)
                .with_for_update(skip_locked=True)
            ).all()
            claimed = []
            for delivery in deliveries:
                delivery.next_attempt_at = now + self._claim_for
                endpoint = session.get(WebhookEndpoint, delivery.endpoint_id)
                event = session.get(WebhookEvent, delivery.event_id)
                assert endpoint is not None and event is not None  # foreign keys
                claimed.append(
                    Claimed(
                        delivery_id=delivery.id, url=endpoint.url, secret=endpoint.secret,
                        endpoint_deleted=endpoint.deleted_at is not None, body=event_body(event.payload),
                        event_id=event.id, event_type=event.type, event_created_at=event.created_at,
                    )
                )
            return claimed

    def _attempt(self, item: Claimed) -> Outcome:
        started = time.monotonic()

        def outcome(ok: bool, status: int | None, error: str | None, excerpt: str | None = None) -> Outcome:
            return Outcome(ok, status, error, excerpt, int((time.monotonic() - started) * 1000))

        try:
            destination = check_destination(item.url, self._allow)  # again: DNS may have changed since registration
        except WebhookUrlRefused as exc:
            return outcome(False, None, f"refused before sending: {exc.message}")
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "gpupool-webhooks/1",
            "Host": destination.host_header(),
            "Gpupool-Event-Id": item.event_id,
            "Gpupool-Event-Type": item.event_type,
            SIGNATURE_HEADER: signature_header(item.body, item.secret, int(time.time())),
        }
        extensions = {"sni_hostname": destination.host} if destination.scheme == "https" else {}
        try:
            with self._http.stream("POST", destination.pinned_url(), content=item.body, headers=headers, extensions=extensions) as response:
                answer = bytearray()
                for block in response.iter_bytes():
                    answer += block
                    if len(answer) >= self._settings.webhook_max_response_bytes:
                        break  # the rest is never read: a receiver cannot make the sender download a flood
                excerpt = bytes(answer[:RESPONSE_EXCERPT_CHARS]).decode(errors="replace")
                if response.is_redirect:
                    return outcome(False, response.status_code, "redirects are not followed", excerpt)
                if response.is_success:
                    return outcome(True, response.status_code, None, excerpt)
                return outcome(False, response.status_code, f"HTTP {response.status_code}", excerpt)
        except httpx.HTTPError as exc:
            return outcome(False, None, f"{type(exc).__name__}: {exc}"[:500])

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
                log.warning("webhook %s to %s given up after %d attempts", item.event_id, item.url, delivery.attempts)
            else:
                delivery.next_attempt_at = retry_at


def add_job_callback(settings: Settings, session: Session, job: Job, url: str) -> WebhookEndpoint:
    """A submit's ``callback_url``: an endpoint for this job alone, added to the job row's transaction."""
    check_destination(url, allowed_networks(settings.webhook_allow_cidrs))
    endpoint = WebhookEndpoint(
        id=str(uuid.uuid4()), account=job.account, job_id=job.id, url=url, events=",".join(EVENT_TYPES),
        secret=new_secret(), created_at=utcnow(),
    )
    session.add(endpoint)
    return endpoint


def job_callback_secret(session: Session, job_id: str) -> str | None:
    return session.scalar(select(WebhookEndpoint.secret).where(WebhookEndpoint.job_id == job_id))
