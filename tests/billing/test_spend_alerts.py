"""Spend alerts from billing passes over recorded sacct output, emailed through a real SMTP server on loopback.

No Slurm: each pass is a replay of recorded sacct text (``billing.passes.replay``),
in a PostgreSQL database of this module's own.
"""

from __future__ import annotations

import datetime as dt
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from sqlalchemy import func, select

from api.event_schemas import validate_event
from billing import passes
from billing.alerts import fire_alerts, set_alert_settings
from billing.report.alerts import alerts_sent as report_alerts
from billing.sacct import SACCT_FIELDS
from gpupool.email_outbox import send_due
from gpupool.models import (
    Account,
    Adjustment,
    AlertSent,
    AlertSettings,
    EmailOutbox,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from gpupool.models.alerts import EMAIL_PENDING, EMAIL_SENT
from gpupool.slurm.client import SlurmClient
from gpupool.webhooks.events import BUDGET_FORECAST, BUDGET_THRESHOLD
from tests.billing.conftest import LedgerDb, _prepare
from tests.conftest import bearer, create_app_for_tests, create_database, drop_database
from tests.support.sacct_dumps import as_pass_output

HEADER = "|".join(SACCT_FIELDS)
TRES = "cpu=1,gres/gpu:rtx4090=1,gres/gpu=1"  # 0.00012 per second
CREDIT_NANOS = 1_000_000_000  # 1.00


class Inbox:
    """aiosmtpd's handler: keeps every message it is given."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's hook name
        self.messages.append(envelope)
        return "250 OK"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[LedgerDb]:
    name = f"gpupool_alerts_{secrets.token_hex(4)}"
    ledger = _prepare(create_database(name), tmp_path / "archive")
    # Retries due at once: the test decides when the server is up, not a clock.
    ledger.settings = ledger.settings.replace(
        smtp_host="127.0.0.1", smtp_port=free_port(), smtp_starttls=False, smtp_from="billing@gpupool.test", email_backoff_s=0.0
    )
    yield ledger
    ledger.engine.dispose()
    drop_database(name)


def add_customer(ledger: LedgerDb, name: str) -> None:
    ledger.add_account(name, prepaid_credit_nanos=CREDIT_NANOS)
    with ledger.sessions() as session, session.begin():
        set_alert_settings(session, name, None, f"ops@{name}.example", dt.datetime.now(dt.UTC))
        session.add(
            WebhookEndpoint(
                id=f"ep-{name}", account=name, url="https://hooks.example.com/x", events=BUDGET_THRESHOLD,
                secret="whsec_test", created_at=dt.datetime.now(dt.UTC),
            )
        )


def bill(ledger: LedgerDb, tmp_path: Path, job: int, account: str, seconds: int) -> Path:
    """Replay one finished 1-GPU run of ``seconds`` as a pass sees it; the file, for rerunning."""
    start = dt.datetime(2026, 10, 1, 0, 0) + dt.timedelta(days=job % 20)
    end = start + dt.timedelta(seconds=seconds)
    fields = ["gpupool", str(job), str(job), account, "alice", "COMPLETED", f"{start:%Y-%m-%dT%H:%M:%S}",
              f"{start:%Y-%m-%dT%H:%M:%S}", f"{end:%Y-%m-%dT%H:%M:%S}", str(seconds), TRES, "train"]
    path = tmp_path / f"pass-{job}.psv"
    path.write_text(as_pass_output([HEADER, "|".join(fields)]))
    passes.replay(ledger.sessions, ledger.settings, path)
    return path


def fired(ledger: LedgerDb, account: str) -> list[tuple[str, int, str, int, int]]:
    with ledger.sessions() as session:
        rows = session.execute(
            select(AlertSent.kind, AlertSent.threshold, AlertSent.period_key, AlertSent.used_nanos, AlertSent.total_nanos)
            .where(AlertSent.account == account)
            .order_by(AlertSent.threshold)
        )
        return [tuple(row) for row in rows]  # type: ignore[misc]


def counts(ledger: LedgerDb, account: str) -> tuple[int, int]:
    """Webhook deliveries and emails queued for ``account``."""
    with ledger.sessions() as session:
        deliveries = session.scalar(
            select(func.count()).select_from(WebhookDelivery).join(WebhookEvent).where(WebhookEvent.account == account)
        )
        emails = session.scalar(select(func.count()).select_from(EmailOutbox).where(EmailOutbox.account == account))
        return int(deliveries or 0), int(emails or 0)


def test_each_threshold_fires_once_with_one_webhook_and_one_email(ledger: LedgerDb, tmp_path: Path) -> None:
    add_customer(ledger, "acme")
    first = bill(ledger, tmp_path, 101, "acme", 5000)  # 0.60 of 1.00
    assert [row[:2] for row in fired(ledger, "acme")] == [("credit", 50)]
    assert counts(ledger, "acme") == (1, 1)
    passes.replay(ledger.sessions, ledger.settings, first)  # the same pass again: nothing new
    assert counts(ledger, "acme") == (1, 1)
    bill(ledger, tmp_path, 102, "acme", 2000)  # 0.84
    bill(ledger, tmp_path, 103, "acme", 2000)  # 1.08
    assert fired(ledger, "acme") == [
        ("credit", 50, "credit:1.00", 600_000_000, CREDIT_NANOS),
        ("credit", 80, "credit:1.00", 840_000_000, CREDIT_NANOS),
        ("credit", 100, "credit:1.00", 1_080_000_000, CREDIT_NANOS),
    ]
    assert counts(ledger, "acme") == (3, 3)
    with ledger.sessions() as session:
        payloads = [e.payload for e in session.scalars(select(WebhookEvent).order_by(WebhookEvent.created_at, WebhookEvent.id))]
    alerts = sorted((p["data"]["alert"] for p in payloads), key=lambda a: a["threshold"])
    assert alerts[1] == {
        "account": "acme", "kind": "credit", "threshold": 80, "used": "0.84", "total": "1.00",
        "currency": ledger.settings.currency, "period": "credit:1.00",
    }
    assert {p["type"] for p in payloads} == {BUDGET_THRESHOLD}
    for payload in payloads:
        validate_event(payload)
    # A top-up is a new grant: its thresholds are armed again (1.08 of 2.00 is past 50 %).
    with ledger.sessions() as session, session.begin():
        account = session.get(Account, "acme")
        assert account is not None
        account.prepaid_credit_nanos = 2 * CREDIT_NANOS
    bill(ledger, tmp_path, 104, "acme", 1)
    assert [row[:3] for row in fired(ledger, "acme") if row[2] == "credit:2.00"] == [("credit", 50, "credit:2.00")]
    # The operator report counts them: 50 % twice (once per grant), 80 % and 100 % once.
    with ledger.sessions() as session:
        window = (dt.datetime(2000, 1, 1, tzinfo=dt.UTC), dt.datetime(2100, 1, 1, tzinfo=dt.UTC))
        shown = [(a["account"], a["kind"], a["threshold"], a["sent"]) for a in report_alerts(session, *window)]
    assert shown == [("acme", "credit", 50, 2), ("acme", "credit", 80, 1), ("acme", "credit", 100, 1)]


def test_a_stopped_mail_server_never_holds_a_pass_and_the_email_goes_out_later(ledger: LedgerDb, tmp_path: Path) -> None:
    add_customer(ledger, "bravo")
    bill(ledger, tmp_path, 201, "bravo", 5000)  # nothing listens on smtp_port: the pass does not care
    assert send_due(ledger.sessions, ledger.settings) == (0, 1)
    with ledger.sessions() as session:
        email = session.scalars(select(EmailOutbox)).one()
        assert (email.state, email.attempts) == (EMAIL_PENDING, 1)
        assert email.last_error and "Connection" in email.last_error
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=ledger.settings.smtp_port)
    controller.start()
    try:
        assert send_due(ledger.sessions, ledger.settings) == (1, 0)
    finally:
        controller.stop()
    [envelope] = inbox.messages
    assert envelope.rcpt_tos == ["ops@bravo.example"]
    assert envelope.mail_from == "billing@gpupool.test"
    text = envelope.content.decode()
    assert "Subject: gpupool: account bravo has used 50% of its prepaid credit" in text
    assert "used 0.60 " in text and "of 1.00 " in text
    with ledger.sessions() as session:
        assert session.scalars(select(EmailOutbox.state)).one() == EMAIL_SENT
    assert send_due(ledger.sessions, ledger.settings) == (0, 0)  # sent once


def test_thresholds_endpoint_validates_and_shows_only_the_callers_account(ledger: LedgerDb, tmp_path: Path) -> None:
    add_customer(ledger, "acme")
    ledger.add_account("other", prepaid_credit_nanos=CREDIT_NANOS)
    bill(ledger, tmp_path, 301, "acme", 5000)
    client = create_app_for_tests(ledger.settings, SlurmClient(ledger.settings), ledger.sessions).test_client()
    acme, other = bearer(ledger.settings, "acme"), bearer(ledger.settings, "other")
    answer = client.get("/account/alerts", headers=acme)
    assert answer.status_code == 200
    assert answer.get_json() == {
        "account": "acme", "thresholds": [50, 80, 100], "forecast_hours": None,
        "budgets": [{
            "kind": "credit", "period": "credit:1.00", "used": "0.60", "total": "1.00", "currency": ledger.settings.currency, "fired": [50],
            "rate_per_hour": "0.00", "hours_left": None, "forecast_fired": False,
        }],
    }
    for bad in ([0], [101], [50.5], ["50"], list(range(1, 13)), [], "50,80", None):
        refused = client.put("/account/alerts", json={"thresholds": bad}, headers=acme)
        assert refused.status_code == 422, bad
        assert refused.get_json()["error"] == "validation_failed"
    assert client.put("/account/alerts", json={"thresholds": [90], "x": 1}, headers=acme).status_code == 400
    changed = client.put("/account/alerts", json={"thresholds": [90, 25, 25]}, headers=acme)
    assert changed.status_code == 200 and changed.get_json()["thresholds"] == [25, 90]
    assert client.get("/account/alerts?account=acme", headers=other).status_code == 404
    theirs = client.get("/account/alerts", headers=other).get_json()
    assert theirs["account"] == "other" and theirs["thresholds"] == [50, 80, 100] and theirs["budgets"][0]["fired"] == []


def test_a_monthly_limit_fires_once_a_month(ledger: LedgerDb) -> None:
    """Spend in a month (here an operator's charge) against the limit; the next month starts again from nothing."""
    ledger.add_account("limited", monthly_limit_nanos=CREDIT_NANOS)
    october = dt.datetime(2026, 10, 15, tzinfo=dt.UTC)
    with ledger.sessions() as session, session.begin():
        session.add(
            Adjustment(
                account="limited", period="2026-10", amount_nanos=850_000_000, reason="support hours", kind="manual",
                created_by="operator", created_at=october,
            )
        )
    for _ in range(2):  # the second call is a rerun: nothing more
        with ledger.sessions() as session, session.begin():
            fire_alerts(session, ledger.settings, ["limited", "not-ours"], october)
    assert fired(ledger, "limited") == [("limit", 50, "2026-10", 850_000_000, CREDIT_NANOS), ("limit", 80, "2026-10", 850_000_000, CREDIT_NANOS)]
    with ledger.sessions() as session, session.begin():
        assert fire_alerts(session, ledger.settings, ["limited"], dt.datetime(2026, 11, 2, tzinfo=dt.UTC)) == 0


def test_a_run_out_forecast_fires_once_when_the_last_days_rate_empties_the_credit_in_time(ledger: LedgerDb, tmp_path: Path) -> None:
    add_customer(ledger, "acme")
    with ledger.sessions() as session, session.begin():
        set_alert_settings(session, "acme", (100,), None, dt.datetime.now(dt.UTC), forecast_hours=100)
        endpoint = session.get(WebhookEndpoint, "ep-acme")
        assert endpoint is not None
        endpoint.events = f"{BUDGET_THRESHOLD},{BUDGET_FORECAST}"
    bill(ledger, tmp_path, 101, "acme", 2000)  # 0.24 of 1.00, from 2026-10-02T00:00:00
    assert fired(ledger, "acme") == []  # billed now, long after the run: no spend in the last 24 hours
    # An hour after the run: 0.24 a day, so the 0.76 left lasts 76 hours, within 100.
    after_run = dt.datetime(2026, 10, 2, 1, 33, 20, tzinfo=dt.UTC)
    for _ in range(2):  # a rerun fires nothing again
        with ledger.sessions() as session, session.begin():
            fire_alerts(session, ledger.settings, ["acme"], after_run)
    assert [row[:2] for row in fired(ledger, "acme")] == [("forecast", 100)]
    assert counts(ledger, "acme") == (1, 1)
    with ledger.sessions() as session:
        (payload,) = [e.payload for e in session.scalars(select(WebhookEvent))]
        (email,) = session.scalars(select(EmailOutbox)).all()
    assert payload["type"] == BUDGET_FORECAST
    validate_event(payload)
    alert = payload["data"]["alert"]
    assert (alert["remaining"], alert["rate_per_hour"], alert["hours_left"], alert["forecast_hours"]) == ("0.76", "0.01", "76.0", 100)
    assert "about 76.0 hours" in email.subject


def test_the_operator_sets_thresholds_recipient_and_forecast_from_the_command_line(ledger: LedgerDb) -> None:
    """``gpupool account set`` writes what ``GET /account/alerts`` then shows; bad values exit non-zero, changing nothing."""
    ledger.add_account("acme", prepaid_credit_nanos=CREDIT_NANOS)
    done = ledger.cli(
        "account", "set", "acme", "--alert-thresholds", "75,25", "--alert-email", "ops@acme.example", "--forecast-hours", "48"
    )
    assert done.returncode == 0, done.stderr
    client = create_app_for_tests(ledger.settings, SlurmClient(ledger.settings), ledger.sessions).test_client()
    shown = client.get("/account/alerts", headers=bearer(ledger.settings, "acme")).get_json()
    assert (shown["thresholds"], shown["forecast_hours"]) == ([25, 75], 48)
    for bad, message in ((("--forecast-hours", "0"), "1 to 2160"), (("--forecast-hours", "soon"), "whole number"),
                         (("--alert-thresholds", "50,120"), "threshold")):
        refused = ledger.cli("account", "set", "acme", *bad)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr
    # Only the flag given changes: the recipient and thresholds stay, the forecast goes off.
    assert ledger.cli("account", "set", "acme", "--forecast-hours", "none").returncode == 0
    with ledger.sessions() as session:
        row = session.get(AlertSettings, "acme")
        assert row is not None and (row.thresholds, row.email, row.forecast_hours) == ("25,75", "ops@acme.example", None)
