"""Interactive sessions: a job of a session template, served through gpupool's proxy.

A session job runs gpupool's shim (gpupool.session_shim) on its node; the shim
listens on the node's cluster address and writes only its port into a file
the run-as helper made in the job's folder. The host is never the job's to
say: it is what the Slurm node the job runs on resolves to. Every request
through the proxy (nginx, ``auth_request``) is checked here against a cookie
of the session's own origin, set by a single-use link that ``GET
/jobs/<id>/session`` hands out; the answer gives nginx the upstream and the
session's secret, which the shim checks. A session with no byte through the
shim, no open WebSocket and no busy GPU for its idle timeout is cancelled as
its tenant: a GPU is busy at or over the job's idle threshold
(``gpupool.gpu_usage.idle``), as ``gpupool idle check`` sampled it, so a
kernel training with the browser closed keeps its session.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import logging
import secrets
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from gpupool import joblogs
from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.errors import CommandFailed, GpupoolError, LogUnavailable
from gpupool.gpu_usage.idle import last_busy_at
from gpupool.http import FetchFailed, fetch
from gpupool.models.accounts import Account
from gpupool.models.jobs import Job
from gpupool.models.sessions import COOKIE, LINK, JobSession, SessionGrant
from gpupool.models.tokens import IssuedToken
from gpupool.render import SESSION_PORT_FILE
from gpupool.session_shim import NO_PRIVATE_NETWORK_EXIT, STATUS_PATH
from gpupool.slurm.client import SlurmClient
from gpupool.templates import Template
from gpupool.tokens import Principal

log = logging.getLogger("gpupool.sessions")

LABEL_BYTES = 10
SECRET_BYTES = 32
GRANT_BYTES = 32
MAC_BYTES = 16
# A grant's value: 43 characters of randomness, a dot, 22 of its MAC.
MAX_GRANT_LENGTH = 96
COOKIE_NAME = "gpupool_session_grant"
# Over TLS the browser keeps a __Host- cookie to the one origin that set it: no sibling can set or shadow it.
SECURE_COOKIE_NAME = "__Host-" + COOKIE_NAME
OPEN_PATH = "/.gpupool/open"
_MAC_LABEL = b"gpupool session grant v1"
# What the port file may hold: a port and a newline. More is not read.
_PORT_FILE_MAX = 16
NO_PRIVATE_NETWORK_REASON = (
    "the node could not give the session's app a private network (user and network namespaces); "
    "the job's stderr says why"
)
STARTING, READY, IDLE, ENDED = "starting", "ready", "idle", "ended"


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def grant_cookie_name(settings: Settings) -> str:
    """The grant cookie's name: ``__Host-`` prefixed when the sessions are served over TLS."""
    return SECURE_COOKIE_NAME if settings.sessions_url.startswith("https://") else COOKIE_NAME


def _mac(settings: Settings, kind: str, label: str, nonce: str) -> str:
    key = hmac.new(settings.session_proxy_key.encode(), _MAC_LABEL, hashlib.sha256).digest()
    digest = hmac.new(key, f"{kind}|{label}|{nonce}".encode(), hashlib.sha256).digest()[:MAC_BYTES]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def new_grant_value(settings: Settings, kind: str, label: str) -> str:
    """A link's or a cookie's value: random, with a MAC of its kind and its session's label under a key of the service's."""
    nonce = secrets.token_urlsafe(GRANT_BYTES)
    return f"{nonce}.{_mac(settings, kind, label, nonce)}"


def grant_value_signed(settings: Settings, kind: str, label: str, value: str) -> bool:
    """Whether ``value`` is one gpupool made for this kind and session. Pure and cheap: a value that
    is not (a guess, a flood of random cookies, another session's cookie) never reaches the database."""
    if not 0 < len(value) <= MAX_GRANT_LENGTH or not 0 < len(label) <= 32:
        return False
    nonce, dot, mac = value.partition(".")
    return bool(dot) and hmac.compare_digest(mac.encode(), _mac(settings, kind, label, nonce).encode())


def port_range(settings: Settings) -> tuple[int, int]:
    low, _, high = settings.session_ports.partition("-")
    return int(low), int(high)


def new_session(job_id: str, template: Template, idle_timeout_min: int | None) -> JobSession:
    """The session record of a new job; the customer's idle timeout only ever shortens the operator's."""
    assert template.session is not None
    limit = template.session.idle_timeout_min
    return JobSession(
        job_id=job_id,
        label=secrets.token_hex(LABEL_BYTES),
        secret=secrets.token_urlsafe(SECRET_BYTES),
        idle_timeout_min=min(idle_timeout_min or limit, limit),
    )


def session_origin(settings: Settings, label: str) -> str:
    parts = urlsplit(settings.sessions_url)
    return f"{parts.scheme}://{label}.{parts.netloc}"


def node_address(node: str) -> str:
    """The node's cluster address, as the shim on it resolves its own name: IPv4, first answer."""
    infos = socket.getaddrinfo(node, None, socket.AF_INET, socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"node {node!r} does not resolve")
    return str(infos[0][4][0])


def read_port(settings: Settings, job: Job, owner_uid: int | None) -> int | None:
    """The port the job's shim wrote, if it wrote a valid one of the operator's range; None otherwise.

    Read like a log (no link followed, a regular file the tenant owns, bounded), and
    believed only as a number within session_ports: the host comes from Slurm, and the
    proxy sends the session's secret to whatever is there, which refuses a wrong one.
    """
    try:
        handle = joblogs.open_log(f"{job.job_dir}/{SESSION_PORT_FILE}", owner_uid=owner_uid)
    except LogUnavailable as exc:
        log.warning("job %s: port file refused: %s", job.id, exc.message)
        return None
    if handle is None:
        return None
    with handle:
        data, _ = joblogs.read_from(handle, 0, _PORT_FILE_MAX)
    text = data.decode("ascii", errors="replace").strip()
    if not text.isdigit():
        return None
    port = int(text)
    low, high = port_range(settings)
    return port if low <= port <= high else None


@dataclass(frozen=True)
class ShimStatus:
    idle_s: int
    websockets: int


def shim_status(host: str, port: int, secret: str, timeout_s: float) -> ShimStatus | None:
    """The shim's own count of idle seconds and open WebSockets; None when it does not answer as the shim."""
    try:
        answer = fetch(
            f"http://{host}:{port}{STATUS_PATH}", timeout_s=timeout_s, max_bytes=4096,
            headers={"X-Gpupool-Session-Secret": secret},
        )
        if answer.status != 200:
            return None
        data = json.loads(answer.body)
        idle_s, websockets = data["idle_s"], data["websockets"]
    except (FetchFailed, ValueError, KeyError, TypeError):
        return None
    if not (isinstance(idle_s, int) and isinstance(websockets, int)):
        return None
    return ShimStatus(idle_s=max(0, idle_s), websockets=max(0, websockets))


def _owner_uid(db: Session, job: Job) -> int | None:
    """The uid the job runs as: its member's own user's, else the account's."""
    if job.unix_uid is not None:
        return job.unix_uid
    account = db.get(Account, job.account)
    return None if account is None else account.unix_uid


def note_ready(db: Session, settings: Settings, job: Job, record: JobSession, now: dt.datetime) -> bool:
    """Look for the port once the job runs; True when the session has one (the caller commits)."""
    if record.port is not None:
        return True
    if job.state != "RUNNING" or job.node is None:
        return False
    port = read_port(settings, job, _owner_uid(db, job))
    if port is None:
        return False
    record.port, record.ready_at, record.last_active_at = port, now, now
    return True


def session_view(settings: Settings, job: Job, record: JobSession, now: dt.datetime) -> dict[str, Any]:
    """What the customer sees: starting, ready, idle (for N minutes) or ended, and the origin."""
    view: dict[str, Any] = {
        "job_id": job.id,
        "url": session_origin(settings, record.label) + "/",
        "idle_timeout_min": record.idle_timeout_min,
        "idle_min": None,
        "end_reason": job.end_reason,
    }
    if job.finished or record.idle_stopped_at is not None:
        view["state"] = ENDED
        # The shim refused to start the app where other jobs could reach it: say so, not just "exit code 78".
        if job.end_reason is None and record.port is None and job.exit_code == NO_PRIVATE_NETWORK_EXIT:
            view["end_reason"] = NO_PRIVATE_NETWORK_REASON
    elif record.port is None:
        view["state"] = STARTING
    else:
        last = record.last_active_at or record.ready_at or now
        idle_min = max(0, int((now - last).total_seconds() // 60))
        view["state"] = IDLE if idle_min >= 1 else READY
        view["idle_min"] = idle_min
    return view


def issue_link(db: Session, settings: Settings, record: JobSession, caller: Principal, now: dt.datetime) -> str:
    """A single-use link that sets the session's cookie on its own origin (the caller commits)."""
    db.execute(delete(SessionGrant).where(SessionGrant.expires_at <= now))
    value = new_grant_value(settings, LINK, record.label)
    db.add(
        SessionGrant(
            value_hash=_hash(value), kind=LINK, job_id=record.job_id, jti=caller.jti, created_at=now,
            expires_at=now + dt.timedelta(seconds=settings.session_link_ttl_s),
        )
    )
    return f"{session_origin(settings, record.label)}{OPEN_PATH}?link={value}"


def _live_grant(
    db: Session, settings: Settings, label: str, value: str, kind: str, now: dt.datetime
) -> tuple[SessionGrant, JobSession, Job] | None:
    """The grant ``value`` of ``kind`` for the session at ``label``, if unexpired, unused (links), its token in good standing."""
    if not grant_value_signed(settings, kind, label, value):
        return None
    row = db.execute(
        select(SessionGrant, JobSession, Job)
        .join(JobSession, JobSession.job_id == SessionGrant.job_id)
        .join(Job, Job.id == SessionGrant.job_id)
        .join(IssuedToken, IssuedToken.jti == SessionGrant.jti)
        .join(Account, Account.name == Job.account)
        .where(
            SessionGrant.value_hash == _hash(value),
            SessionGrant.kind == kind,
            SessionGrant.expires_at > now,
            JobSession.label == label,
            # The token's account is the job's: an admin's or another account's grant opens nothing.
            IssuedToken.account == Job.account,
            IssuedToken.revoked_at.is_(None),
            IssuedToken.expires_at > now,
            Account.disabled_at.is_(None),
        )
    ).one_or_none()
    if row is None:
        return None
    grant, record, job = row
    if kind == LINK and grant.used_at is not None:
        return None
    return grant, record, job


def redeem_link(db: Session, settings: Settings, label: str, value: str, now: dt.datetime) -> str | None:
    """The cookie value for a link used for the first time, or None (used, expired, not this session's).

    The link is marked used in the same statement that checks it is unused, so two
    requests racing with one link get one cookie between them.
    """
    found = _live_grant(db, settings, label, value, LINK, now)
    if found is None:
        return None
    grant, _record, job = found
    if job.finished:
        return None
    claimed = db.execute(
        update(SessionGrant)
        .where(SessionGrant.value_hash == grant.value_hash, SessionGrant.used_at.is_(None))
        .values(used_at=now)
        .execution_options(synchronize_session=False)
    )
    if getattr(claimed, "rowcount", 0) != 1:
        db.rollback()
        return None
    cookie = new_grant_value(settings, COOKIE, label)
    db.add(
        SessionGrant(
            value_hash=_hash(cookie), kind=COOKIE, job_id=job.id, jti=grant.jti, created_at=now,
            expires_at=now + dt.timedelta(seconds=settings.session_cookie_ttl_s),
        )
    )
    db.commit()
    return cookie


@dataclass(frozen=True)
class Upstream:
    job_id: str
    address: str
    secret: str


def authorize(db: Session, settings: Settings, label: str, cookie: str, now: dt.datetime) -> Upstream | None:
    """Where the proxy sends a request carrying ``cookie`` to the session at ``label``; None: 404 to the browser."""
    found = _live_grant(db, settings, label, cookie, COOKIE, now)
    if found is None:
        return None
    _grant, record, job = found
    if job.finished or record.idle_stopped_at is not None or job.node is None:
        return None
    if not note_ready(db, settings, job, record, now):
        db.rollback()
        return None
    db.commit()
    try:
        host = node_address(job.node)
    except OSError as exc:
        log.warning("session of job %s: node %s does not resolve: %s", job.id, job.node, exc)
        return None
    return Upstream(job_id=job.id, address=f"{host}:{record.port}", secret=record.secret)


def idle_reason(minutes: int, threshold_pct: int) -> str:
    return f"idle: no request, no open WebSocket and no GPU at {threshold_pct}% or more for {minutes} min; gpupool cancelled it"


def stop_due(active_at: dt.datetime, gpus_busy_at: dt.datetime | None, timeout_min: int, now: dt.datetime) -> bool:
    """Whether a session is idle for its timeout: no request or WebSocket since ``active_at``, no busy GPU since
    ``gpus_busy_at`` (None: not in the samples read). Pure."""
    since = active_at if gpus_busy_at is None else max(active_at, gpus_busy_at)
    return now - since >= dt.timedelta(minutes=timeout_min)


def sweep_idle(db: Session, settings: Settings, slurm: SlurmClient, now: dt.datetime) -> list[str]:
    """Cancel, as their tenants, the running sessions idle for their timeout; the ids of the jobs cancelled.

    Activity is the shim's own count (bytes relayed, WebSockets open) and the
    job's GPU samples: a GPU at or over the idle threshold within the timeout
    keeps the session. A shim that does not answer has nothing going through
    it: its session ages from the last activity seen, or from its start when it
    never became ready. No samples (no exporter, no idle check) is no evidence
    of a busy GPU.
    """
    rows = db.execute(
        select(JobSession, Job)
        .join(Job, Job.id == JobSession.job_id)
        .where(Job.finished.is_(False), Job.state == "RUNNING", JobSession.idle_stopped_at.is_(None))
    ).all()
    stopped: list[str] = []
    for record, job in rows:
        note_ready(db, settings, job, record, now)
        status = None
        if record.port is not None and job.node is not None:
            try:
                status = shim_status(node_address(job.node), record.port, record.secret, settings.session_status_timeout_s)
            except OSError:
                status = None
        if status is not None:
            seen = now if status.websockets > 0 else now - dt.timedelta(seconds=status.idle_s)
            if record.last_active_at is None or seen > record.last_active_at:
                record.last_active_at = seen
        since = record.last_active_at or record.ready_at or job.started_at or now
        timeout = dt.timedelta(minutes=record.idle_timeout_min)
        if now - since < timeout:
            continue
        gpus_busy_at, threshold = last_busy_at(db, settings, job, now - timeout)
        if not stop_due(since, gpus_busy_at, record.idle_timeout_min, now):
            continue  # no request, but a GPU at work: a kernel training with the browser closed
        assert job.slurm_job_id is not None
        log.info("session of job %s (Slurm %s) idle since %s: cancelling it", job.id, job.slurm_job_id, utc_text(since))
        try:
            slurm.cancel(job.slurm_job_id, job.account, user=job.unix_user)
        except CommandFailed as exc:
            if "Invalid job id" not in exc.stderr and "already completing or completed" not in exc.stderr:
                log.warning("session of job %s: scancel failed: %s", job.id, exc.message)
                continue
        except GpupoolError as exc:
            log.warning("session of job %s: scancel failed: %s", job.id, exc.message)
            continue
        record.idle_stopped_at = now
        job.end_reason = idle_reason(record.idle_timeout_min, threshold)
        stopped.append(job.id)
    db.commit()
    return stopped
