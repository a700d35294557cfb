"""The operator's webhook: events about the cluster, not an account, through the customers' outbox.

One endpoint row belongs to no account (migration 0031, id ``operator``); its
URL and secret are the site's settings (``operator_webhook_url``,
``operator_webhook_secret``), which the sender reads when it sends, so a change
of either needs no database write, and no API caller ever lists the row (every
listing is by account). Billing enqueues each drain's ``node.drained`` in the
pass that records the drain, so it is sent once per drain.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy.orm import Session

from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.models.webhooks import PENDING, WebhookDelivery, WebhookEvent

OPERATOR_ENDPOINT_ID = "operator"
# The sender's share of its slots for the operator's deliveries, counted as one account's.
OPERATOR_SHARE_KEY = "(operator)"


def enqueue_operator_event(session: Session, settings: Settings, event_type: str, now: dt.datetime, data: dict[str, Any]) -> bool:
    """One event for the operator's webhook, in the caller's transaction; False (nothing added) when none is set."""
    if not settings.operator_webhook_url:
        return False
    event_id = f"evt_{uuid.uuid4().hex}"
    payload = {"id": event_id, "type": event_type, "created_at": utc_text(now, timespec="auto"), "data": data}
    session.add(WebhookEvent(id=event_id, account=None, job_id=None, type=event_type, payload=payload, created_at=now))
    session.flush()  # the event before its delivery's foreign key
    session.add(WebhookDelivery(event_id=event_id, endpoint_id=OPERATOR_ENDPOINT_ID, state=PENDING, attempts=0, next_attempt_at=now))
    return True
