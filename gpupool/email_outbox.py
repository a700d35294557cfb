"""The email outbox's sender: spend alerts to the operator's SMTP server, retried with backoff.

Billing only inserts rows (``billing.alerts``); ``gpupool email send-due`` (cron,
or after each ``gpupool webhooks run`` loop) sends what is due. Each message
is claimed by moving its ``next_attempt_at`` past the SMTP timeout first, so
two senders never send one twice at once; a failure is retried after
``email_backoff_s`` doubling up to an hour, and given up after
``email_max_attempts``. The SMTP password is read from its file for each
batch and never logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import smtplib
import ssl
from email.message import EmailMessage
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.db import utcnow
from gpupool.models import EmailOutbox
from gpupool.models.alerts import EMAIL_FAILED, EMAIL_PENDING, EMAIL_SENT

log = logging.getLogger("gpupool.email")
MAX_BACKOFF_S = 3600.0


def _password(settings: Settings) -> str | None:
    if not settings.smtp_password_file:
        return None
    return Path(settings.smtp_password_file).read_text().strip()


def _message(settings: Settings, row: EmailOutbox) -> EmailMessage:
    message = EmailMessage()
    message["From"] = settings.smtp_from
    message["To"] = row.recipient
    message["Subject"] = row.subject
    message.set_content(row.body)
    return message


def _send(settings: Settings, message: EmailMessage, password: str | None) -> None:
    with smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=settings.smtp_timeout_s) as smtp:
        if settings.smtp_starttls:
            smtp.starttls(context=ssl.create_default_context())
        if settings.smtp_username:
            smtp.login(settings.smtp_username, password or "")
        smtp.send_message(message)


def send_due(sessions: sessionmaker, settings: Settings, *, batch: int = 50) -> tuple[int, int]:
    """Send the outbox's due emails; ``(sent, failed attempts)``. No SMTP host: nothing is sent."""
    if not settings.smtp_host:
        return 0, 0
    now = utcnow()
    with sessions() as session, session.begin():
        due = session.scalars(
            select(EmailOutbox)
            .where(EmailOutbox.state == EMAIL_PENDING, EmailOutbox.next_attempt_at <= now)
            .order_by(EmailOutbox.next_attempt_at)
            .limit(batch)
            .with_for_update(skip_locked=True)
        ).all()
        claim_until = now + dt.timedelta(seconds=settings.smtp_timeout_s * 3)
        claimed = [(row.id, _message(settings, row)) for row in due]
        for row in due:
            row.next_attempt_at = claim_until
    if not claimed:
        return 0, 0
    password = _password(settings)
    sent = failed = 0
    for row_id, message in claimed:
        try:
            _send(settings, message, password)
            error = None
        except (OSError, smtplib.SMTPException) as exc:
            # The exception's text, never the password: smtplib does not echo credentials.
            error = f"{type(exc).__name__}: {exc}"[:500]
        _record(sessions, settings, row_id, error)
        sent, failed = (sent + 1, failed) if error is None else (sent, failed + 1)
    return sent, failed


def _record(sessions: sessionmaker, settings: Settings, row_id: int, error: str | None) -> None:
    now = utcnow()
    with sessions() as session, session.begin():
        row = session.get(EmailOutbox, row_id)
        assert row is not None
        row.attempts += 1
        row.last_error = error
        if error is None:
            row.state, row.sent_at = EMAIL_SENT, now
            return
        if row.attempts >= settings.email_max_attempts:
            row.state = EMAIL_FAILED
            log.warning("email %s to %s given up after %d attempts: %s", row.id, row.recipient, row.attempts, error)
            return
        backoff = min(MAX_BACKOFF_S, settings.email_backoff_s * 2 ** (row.attempts - 1))
        row.next_attempt_at = now + dt.timedelta(seconds=backoff)
