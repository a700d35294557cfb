"""Spend alerts: a billing pass that takes an account past a threshold of its credit or limit says so, once.

Thresholds are percentages of the prepaid credit (spend ever) or of the
monthly limit (this UTC month's spend) consumed; 50, 80 and 100 unless the
account set its own (``PUT /account/alerts``, ``gpupool account set
--alert-thresholds``). Each fires once per period: the month for a limit,
the credit granted for a credit (its key is the credit's total, so a top-up
re-arms every threshold). ``alerts_sent``'s unique key makes that hold
through reruns and replays.

Everything is written in the pass's own transaction: the ``alerts_sent``
row, a ``budget.threshold`` webhook event with one delivery per endpoint
that wants it, and an email in ``email_outbox`` when the operator has an
SMTP server and the account a recipient. Nothing is sent here: the webhook
sender and ``gpupool email send-due`` deliver later, so a slow receiver or
mail server never slows a pass.

The run-out forecast (``forecast_hours``, off unless the account sets it)
fires ``budget.forecast`` once per period of each budget when, at the last
24 hours' spend rate (ledger charges pro-rated to the part of their usage
interval inside the window), what is left of the budget lasts fewer than
that many hours. It is an ``alerts_sent`` row of kind ``forecast`` whose
threshold is the hours asked for, so the same unique key keeps it to once.
A budget already used up gets no forecast: its 100% threshold says so.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.budgets import balance
from billing.calendar import period_of
from billing.money import format_nanos
from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.models import (
    Account,
    AlertSent,
    AlertSettings,
    EmailOutbox,
    LedgerEntry,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from gpupool.models.alerts import DEFAULT_THRESHOLDS, EMAIL_PENDING
from gpupool.models.webhooks import PENDING
from gpupool.webhooks.events import BUDGET_FORECAST, BUDGET_THRESHOLD

CREDIT = "credit"
LIMIT = "limit"
FORECAST = "forecast"  # alerts_sent.kind of a run-out forecast
MAX_THRESHOLDS = 10
MAX_FORECAST_HOURS = 24 * 90
RATE_WINDOW = dt.timedelta(hours=24)


def parse_thresholds(text: str) -> tuple[int, ...]:
    """``"50,80,100"`` as stored; the column only ever holds what ``check_thresholds`` accepted."""
    return tuple(int(part) for part in text.split(",") if part)


def check_thresholds(values: Iterable[object]) -> tuple[int, ...]:
    """Distinct whole percentages 1..100, at most ``MAX_THRESHOLDS``, ascending; ValueError saying why not."""
    chosen: set[int] = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
            raise ValueError(f"each threshold is a whole percentage from 1 to 100, not {value!r}")
        chosen.add(value)
    if not chosen:
        raise ValueError("give at least one threshold")
    if len(chosen) > MAX_THRESHOLDS:
        raise ValueError(f"at most {MAX_THRESHOLDS} thresholds")
    return tuple(sorted(chosen))


def thresholds_of(session: Session, account: str) -> tuple[tuple[int, ...], str | None]:
    """The account's thresholds and email recipient (defaults when it set none)."""
    row = session.get(AlertSettings, account)
    if row is None:
        return DEFAULT_THRESHOLDS, None
    return parse_thresholds(row.thresholds), row.email


def forecast_hours_of(session: Session, account: str) -> int | None:
    row = session.get(AlertSettings, account)
    return row.forecast_hours if row is not None else None


def window_spend_nanos(session: Session, account: str, now: dt.datetime) -> int:
    """Ledger charges for usage in the ``RATE_WINDOW`` before ``now``, each pro-rated to its part inside it."""
    start = now - RATE_WINDOW
    rows = session.execute(
        select(LedgerEntry.amount_nanos, LedgerEntry.interval_from, LedgerEntry.interval_to).where(
            LedgerEntry.account == account, LedgerEntry.interval_to > start, LedgerEntry.interval_from < now,
            # A ledger row never crosses a month's start, so only the window's months can hold one: the
            # (account, period) index then reads a day's rows, not the account's whole history.
            LedgerEntry.period.in_(sorted({period_of(start), period_of(now)})),
        )
    )
    total = 0
    for amount, begin, end in rows:
        length = (end - begin).total_seconds()
        inside = (min(end, now) - max(begin, start)).total_seconds()
        total += amount if length <= 0 else int(amount * inside // length)
    return total


@dataclass(frozen=True)
class Forecast:
    """The last 24 hours' spend rate and what it leaves of one budget."""

    window_nanos: int  # spend in the window: the rate is this per RATE_WINDOW
    remaining_nanos: int

    @property
    def rate_per_hour_nanos(self) -> int:
        return self.window_nanos * 3600 // int(RATE_WINDOW.total_seconds())

    @property
    def hours_left(self) -> float | None:
        if self.window_nanos <= 0:
            return None
        return max(self.remaining_nanos, 0) * RATE_WINDOW.total_seconds() / 3600 / self.window_nanos

    def hours_left_text(self) -> str | None:
        hours = self.hours_left
        return None if hours is None else f"{hours:.1f}"

    def runs_out_within(self, hours: int) -> bool:
        """Fewer than ``hours`` left at this rate (in exact integers), with something still left."""
        window_hours = int(RATE_WINDOW.total_seconds()) // 3600
        return self.window_nanos > 0 and 0 < self.remaining_nanos and self.remaining_nanos * window_hours < hours * self.window_nanos


@dataclass(frozen=True)
class Crossing:
    account: str
    kind: str
    threshold: int
    period_key: str
    used_nanos: int
    total_nanos: int
    forecast: Forecast | None = None  # a run-out forecast: threshold is then its hours

    @property
    def sent_kind(self) -> str:
        """``alerts_sent.kind``: the budget's kind, or ``forecast``."""
        return FORECAST if self.forecast is not None else self.kind

    @property
    def event_type(self) -> str:
        return BUDGET_FORECAST if self.forecast is not None else BUDGET_THRESHOLD

    def payload_data(self, currency: str) -> dict[str, Any]:
        data: dict[str, Any] = {
            "account": self.account,
            "kind": self.kind,
            "threshold": self.threshold,
            "used": format_nanos(self.used_nanos),
            "total": format_nanos(self.total_nanos),
            "currency": currency,
            "period": self.period_key,
        }
        if self.forecast is not None:
            del data["threshold"]
            data["forecast_hours"] = self.threshold
            data["remaining"] = format_nanos(self.forecast.remaining_nanos)
            data["rate_per_hour"] = format_nanos(self.forecast.rate_per_hour_nanos)
            data["hours_left"] = self.forecast.hours_left_text()
        return data


def period_keys(session: Session, account: str, now: dt.datetime) -> dict[str, tuple[str, int, int]]:
    """``kind -> (period key, used, total)`` for each budget the account has."""
    figures = balance(session, account, now)
    keys: dict[str, tuple[str, int, int]] = {}
    if figures.prepaid_credit_nanos is not None and figures.prepaid_credit_nanos > 0:
        credit = figures.prepaid_credit_nanos
        keys[CREDIT] = (f"credit:{format_nanos(credit)}", figures.spent_total_nanos, credit)
    if figures.monthly_limit_nanos is not None and figures.monthly_limit_nanos > 0:
        keys[LIMIT] = (period_of(now), figures.spent_period_nanos, figures.monthly_limit_nanos)
    return keys


def crossings(session: Session, account: str, now: dt.datetime) -> list[Crossing]:
    """Thresholds the account's spend has reached, and its forecast, that have not fired in their period yet."""
    thresholds, _ = thresholds_of(session, account)
    hours = forecast_hours_of(session, account)
    found: list[Crossing] = []
    budgets = period_keys(session, account, now)
    if hours is not None and budgets:
        window = window_spend_nanos(session, account, now)
        for kind, (key, used, total) in budgets.items():
            forecast = Forecast(window, total - used)
            if forecast.runs_out_within(hours) and session.scalar(
                select(AlertSent.id).where(
                    AlertSent.account == account, AlertSent.kind == FORECAST, AlertSent.threshold == hours, AlertSent.period_key == key
                )
            ) is None:
                found.append(Crossing(account, kind, hours, key, used, total, forecast))
    for kind, (key, used, total) in budgets.items():
        fired = set(
            session.scalars(
                select(AlertSent.threshold).where(AlertSent.account == account, AlertSent.kind == kind, AlertSent.period_key == key)
            )
        )
        found.extend(
            Crossing(account, kind, threshold, key, used, total)
            for threshold in thresholds
            if threshold not in fired and used * 100 >= threshold * total
        )
    return found


def email_text(crossing: Crossing, currency: str) -> tuple[str, str]:
    """Subject and body of the alert's email: plain figures, the account's name as data."""
    what = "prepaid credit" if crossing.kind == CREDIT else f"monthly limit for {crossing.period_key}"
    if crossing.forecast is not None:
        forecast = crossing.forecast
        subject = f"gpupool: account {crossing.account} runs out of its {what} in about {forecast.hours_left_text()} hours"
        body = (
            f"Account {crossing.account} has spent {format_nanos(forecast.rate_per_hour_nanos)} {currency} per hour "
            f"over the last 24 hours. At that rate the {format_nanos(forecast.remaining_nanos)} {currency} left "
            f"of its {what} of {format_nanos(crossing.total_nanos)} {currency} lasts about "
            f"{forecast.hours_left_text()} hours (alert below {crossing.threshold} hours).\n"
        )
        return subject, body
    subject = f"gpupool: account {crossing.account} has used {crossing.threshold}% of its {what}"
    body = (
        f"Account {crossing.account} has used {format_nanos(crossing.used_nanos)} {currency} "
        f"of its {what} of {format_nanos(crossing.total_nanos)} {currency} "
        f"(threshold {crossing.threshold}%).\n"
    )
    return subject, body


def fire_alerts(session: Session, settings: Settings, accounts: Iterable[str], now: dt.datetime, pass_id: int | None = None) -> int:
    """Record and enqueue every newly crossed threshold of ``accounts``, in the caller's transaction; how many."""
    fired = 0
    names = set(accounts)
    if not names:
        return 0
    # Only accounts this database knows with a budget: sacct also reports accounts gpupool does not bill for.
    budgeted = session.scalars(
        select(Account.name).where(
            Account.name.in_(names), Account.prepaid_credit_nanos.is_not(None) | Account.monthly_limit_nanos.is_not(None)
        )
    ).all()
    for account in sorted(budgeted):
        found = crossings(session, account, now)
        if not found:
            continue
        _, email = thresholds_of(session, account)
        endpoints = [
            endpoint
            for endpoint in session.scalars(
                select(WebhookEndpoint).where(
                    WebhookEndpoint.account == account, WebhookEndpoint.deleted_at.is_(None), WebhookEndpoint.job_id.is_(None)
                )
            )
            if endpoint.wants(BUDGET_THRESHOLD) or endpoint.wants(BUDGET_FORECAST)
        ]
        for crossing in found:
            session.add(
                AlertSent(
                    account=account, kind=crossing.sent_kind, threshold=crossing.threshold, period_key=crossing.period_key,
                    used_nanos=crossing.used_nanos, total_nanos=crossing.total_nanos, billing_pass_id=pass_id, created_at=now,
                )
            )
            wanting = [endpoint for endpoint in endpoints if endpoint.wants(crossing.event_type)]
            if wanting:
                _enqueue_event(session, crossing, wanting, settings.currency, now)
            if settings.smtp_host and email:
                subject, body = email_text(crossing, settings.currency)
                session.add(
                    EmailOutbox(
                        account=account, recipient=email, subject=subject, body=body, state=EMAIL_PENDING,
                        attempts=0, next_attempt_at=now, created_at=now,
                    )
                )
            fired += 1
    session.flush()  # the unique key refuses a second firing here, inside the pass
    return fired


def _enqueue_event(session: Session, crossing: Crossing, endpoints: list[WebhookEndpoint], currency: str, now: dt.datetime) -> None:
    event_id = f"evt_{uuid.uuid4().hex}"
    payload = {
        "id": event_id,
        "type": crossing.event_type,
        "created_at": utc_text(now, timespec="auto"),
        "data": {"alert": crossing.payload_data(currency)},
    }
    session.add(
        WebhookEvent(id=event_id, account=crossing.account, job_id=None, type=crossing.event_type, payload=payload, created_at=now)
    )
    session.flush()  # the event before its deliveries' foreign key
    session.add_all(
        WebhookDelivery(event_id=event_id, endpoint_id=endpoint.id, state=PENDING, attempts=0, next_attempt_at=now)
        for endpoint in endpoints
    )


_KEEP: Any = object()


def set_alert_settings(
    session: Session, account: str, thresholds: tuple[int, ...] | None, email: str | None, now: dt.datetime,
    forecast_hours: int | None = _KEEP,
) -> AlertSettings:
    """Store the account's thresholds, recipient (``"none"``: no email) and/or forecast hours (None: off), in the caller's transaction."""
    row = session.get(AlertSettings, account)
    if row is None:
        row = AlertSettings(account=account, thresholds=",".join(map(str, DEFAULT_THRESHOLDS)), email=None, updated_at=now)
        session.add(row)
    if thresholds is not None:
        row.thresholds = ",".join(map(str, check_thresholds(thresholds)))
    if email is not None:
        row.email = None if email.lower() == "none" else email
    if forecast_hours is not _KEEP:
        if forecast_hours is not None and not 1 <= forecast_hours <= MAX_FORECAST_HOURS:
            raise ValueError(f"forecast_hours is 1 to {MAX_FORECAST_HOURS}")
        row.forecast_hours = forecast_hours
    row.updated_at = now
    return row


def alert_status(session: Session, account: str, now: dt.datetime, currency: str) -> dict[str, Any]:
    """What ``GET /account/alerts`` answers: the settings, each budget's figures and forecast, and what fired this period."""
    thresholds, _ = thresholds_of(session, account)
    hours = forecast_hours_of(session, account)
    window = window_spend_nanos(session, account, now)
    budgets = []
    for kind, (key, used, total) in period_keys(session, account, now).items():
        fired = session.scalars(
            select(AlertSent.threshold)
            .where(AlertSent.account == account, AlertSent.kind == kind, AlertSent.period_key == key)
            .order_by(AlertSent.threshold)
        ).all()
        forecast = Forecast(window, total - used)
        forecast_fired = hours is not None and session.scalar(
            select(AlertSent.id).where(
                AlertSent.account == account, AlertSent.kind == FORECAST, AlertSent.threshold == hours, AlertSent.period_key == key
            )
        ) is not None
        budgets.append(
            {
                "kind": kind, "period": key, "used": format_nanos(used), "total": format_nanos(total), "currency": currency,
                "fired": list(fired), "rate_per_hour": format_nanos(forecast.rate_per_hour_nanos),
                "hours_left": forecast.hours_left_text(), "forecast_fired": forecast_fired,
            }
        )
    return {"account": account, "thresholds": list(thresholds), "forecast_hours": hours, "budgets": budgets}
