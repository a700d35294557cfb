"""The report's spend alerts: how many of each the billing passes of the window sent, per account."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.models import AlertSent


def alerts_sent(session: Session, since: dt.datetime, until: dt.datetime) -> list[dict[str, Any]]:
    """Alerts recorded in [since, until), counted by account, kind and threshold, in that order."""
    rows = session.execute(
        select(AlertSent.account, AlertSent.kind, AlertSent.threshold, func.count(), func.max(AlertSent.created_at))
        .where(AlertSent.created_at >= since, AlertSent.created_at < until)
        .group_by(AlertSent.account, AlertSent.kind, AlertSent.threshold)
        .order_by(AlertSent.account, AlertSent.kind, AlertSent.threshold)
    )
    return [
        {"account": account, "kind": kind, "threshold": threshold, "sent": int(count), "last_sent_at": last}
        for account, kind, threshold, count, last in rows
    ]
