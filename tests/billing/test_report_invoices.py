"""The operator report's money is what the month's invoices say, to the cent (issue 35).

An invoice rounds each of its lines to the cent and totals the rounded lines; a report that
summed the exact amounts and rounded once disagreed with the invoices by a cent or more
whenever many lines ended in fractions of a cent. PostgreSQL only: the invoice streams its
lines off a server-side cursor there, as in production.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal
from pathlib import Path

import pytest

from billing.invoice import write_invoice
from billing.money import format_cents
from billing.report import build_report, cents_text
from gpupool.slurm.report import Allocation, NodeEvent, NodeGpuCapacity, PendingJob
from tests.billing.conftest import LedgerDb
from tests.billing.test_ledger import dump, replay_ok, row

PERIOD = "2026-11"
SINCE, UNTIL = dt.datetime(2026, 11, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
ONE_GPU = "cpu=1,gres/gpu:rtx4090=1,gres/gpu=1"
TWO_GPUS = "cpu=1,gres/gpu:rtx4090=2,gres/gpu=2"


class NoCluster:
    """A cluster with no nodes and nothing queued: the report's money comes from the database alone."""

    def node_gpus(self) -> list[NodeGpuCapacity]:
        return []

    def allocations(self, _start: dt.datetime, _end: dt.datetime) -> list[Allocation]:
        return []

    def node_events(self, _start: dt.datetime, _end: dt.datetime) -> list[NodeEvent]:
        return []

    def pending_jobs(self) -> list[PendingJob]:
        return []


def invoice_cents(ledger: LedgerDb, account: str) -> tuple[int, int, int]:
    """(job lines, adjustment lines, total) of the account's invoice, in cents, as its CSV prints them."""
    out = io.StringIO()
    with ledger.engine.connect() as connection:
        write_invoice(connection, account, PERIOD, ledger.settings.currency, out)
    lines = list(csv.DictReader(io.StringIO(out.getvalue())))

    def cents(kind: str) -> int:
        return sum(int(Decimal(line["amount"]) * 100) for line in lines if line["line_type"] == kind)

    return cents("job"), cents("adjustment"), cents("total")


@pytest.mark.parametrize("ledger_db", ["postgresql"], indirect=True)
def test_report_totals_are_the_sums_of_the_months_invoices(ledger_db: LedgerDb, tmp_path: Path) -> None:
    for account in ("acme", "beta", "gamma"):
        ledger_db.add_account(account)
    # At 0.00012 per GPU-second: 40 s is 0.0048 (an invoice line of 0.00), 45 s is 0.0054 (0.01),
    # 2 GPUs x 3601 s is 0.86424 (0.86). Exactly, 0.91524 in all; line by line, 0.91.
    runs = [
        *(row(100 + n, "acme", "COMPLETED", f"2026-11-0{n + 1}T10:00:00", f"2026-11-0{n + 1}T10:00:40", 40, ONE_GPU) for n in range(5)),
        *(row(200 + n, "beta", "COMPLETED", f"2026-11-1{n}T10:00:00", f"2026-11-1{n}T10:00:45", 45, ONE_GPU) for n in range(5)),
        row(300, "gamma", "COMPLETED", "2026-11-20T10:00:00", "2026-11-20T11:00:01", 3601, TWO_GPUS),
    ]
    replay_ok(ledger_db, dump(tmp_path, "month.psv", *runs))
    # Three credits of 0.334: each invoice line -0.33, so -0.99 on the invoice; -1.002 exactly.
    for _ in range(3):
        result = ledger_db.cli("adjust", "--account", "gamma", "--amount", "-0.334", "--reason", "outage", "--period", PERIOD)
        assert result.returncode == 0, result.stderr

    invoices = {account: invoice_cents(ledger_db, account) for account in ("acme", "beta", "gamma")}
    assert invoices == {"acme": (0, 0, 0), "beta": (5, 0, 5), "gamma": (86, -99, -13)}
    with ledger_db.sessions() as session:
        report = build_report(session, NoCluster(), ledger_db.settings, SINCE, UNTIL, UNTIL + dt.timedelta(days=4))  # type: ignore[arg-type]

    charges = sum(job for job, _adjustments, _total in invoices.values())
    adjustments = sum(adjusted for _job, adjusted, _total in invoices.values())
    total = sum(invoiced for _job, _adjustments, invoiced in invoices.values())
    # What `gpupool report` prints: "revenue 0.91, adjustments -0.99, net -0.08".
    assert (cents_text(report.revenue.amount), cents_text(report.revenue.adjustments), cents_text(report.revenue.net)) == (
        format_cents(charges), format_cents(adjustments), format_cents(total),
    )
    # Each account's line of the report is its invoice's job lines.
    assert {line.account: cents_text(line.amount) for line in report.revenue_by_account} == {
        account: format_cents(job) for account, (job, _adjustments, _total) in invoices.items()
    }
    assert cents_text(report.adjustments.total) == format_cents(adjustments)
