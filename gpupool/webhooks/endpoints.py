"""Webhook endpoints the service makes for itself: a submit's ``callback_url``, and every endpoint's signing secret."""

from __future__ import annotations

import secrets
import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.config import Settings, allowed_networks
from gpupool.db import utcnow
from gpupool.models import Job
from gpupool.models.webhooks import WebhookEndpoint
from gpupool.webhooks.destinations import check_destination
from gpupool.webhooks.events import JOB_EVENT_TYPES


def new_secret() -> str:
    return "whsec_" + secrets.token_hex(32)


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
