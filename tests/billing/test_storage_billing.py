"""Account storage billed per GiB-month by the billing pass: exact charges, invoice lines, spend, once only.

The pass measures each account's storage through its ``measure_storage`` seam
(in production ``statvfs`` of the account's volume; tests/live/test_storage.py
shows that figure on real volumes); sacct answers with no runs here.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Mapping

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError

from billing import passes
from billing.report import build_report, cents_text
from billing.sacct import PASS_FIELDS
from billing.usage import usage
from gpupool.config import Settings
from gpupool.models import StorageCharge, StorageSample
from gpupool.proc import CommandResult
from gpupool.slurm.client import SlurmClient
from tests.billing.conftest import LedgerDb
from tests.billing.test_report_invoices import NoCluster

GIB = 1024**3


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def sacct_without_runs(argv: list[str], *, timeout_s: float, env: Mapping[str, str] | None = None, **_: object) -> CommandResult:
    """sacct's answer for a window with no job in it: its header alone, under the pass's own delimiter (sinfo: no node)."""
    if argv[0].endswith("sinfo"):
        return CommandResult(tuple(argv), 0, '{"nodes": []}', "", 0.0)
    delimiter = next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--delimiter="))
    return CommandResult(tuple(argv), 0, delimiter.join(PASS_FIELDS) + "\n", "", 0.0)


class Volumes:
    """What each account's storage holds, as the pass would read it off its filesystem; None: no volume here."""

    def __init__(self) -> None:
        self.stored: dict[str, int] = {}

    def __call__(self, _settings: Settings, account: str) -> int | None:
        return self.stored.get(account)


def run_pass(ledger: LedgerDb, volumes: Volumes, now: str) -> passes.PassReport:
    settings = ledger.settings.replace(storage_root="/srv/gpupool-data")
    slurm = SlurmClient(settings, runner=sacct_without_runs)
    return passes.run_pass(ledger.sessions, slurm, settings, now=utc(now), measure_storage=volumes)


def charges(ledger: LedgerDb, account: str) -> list[tuple[str, str, str, int, int]]:
    with ledger.sessions() as session:
        rows = session.execute(
            select(StorageCharge.period, StorageCharge.interval_from, StorageCharge.interval_to, StorageCharge.stored_bytes,
                   StorageCharge.amount_nanos)
            .where(StorageCharge.account == account).order_by(StorageCharge.interval_from)
        )
        return [(period, start.isoformat(), end.isoformat(), stored, nanos) for period, start, end, stored, nanos in rows]


def invoice(ledger: LedgerDb, account: str, period: str) -> list[list[str]]:
    result = ledger.cli("invoice", "--account", account, "--period", period, "-o", "-")
    assert result.returncode == 0, result.stderr
    return list(csv.reader(io.StringIO(result.stdout, newline="")))


def test_storage_is_charged_by_the_hour_at_what_the_pass_before_saw_and_invoiced_per_gib_month(ledger_db: LedgerDb) -> None:
    ledger_db.add_account("acme")
    ledger_db.add_account("other")
    # 0.072 per GiB-month is 0.0001 per GiB-hour: 1000 GiB for an hour cost 0.10.
    priced = ledger_db.cli("price", "set", "storage", "0.072", "--from", "2026-10-01T00:00:00")
    assert priced.returncode == 0, priced.stderr
    assert "0.072 USD per GiB-month" in priced.stdout
    volumes = Volumes()
    volumes.stored["acme"] = 1000 * GIB  # "other" has no volume on this host: never sampled, never charged
    first = run_pass(ledger_db, volumes, "2026-10-31T22:30:00")
    assert first.storage_charges == 0  # a first sample has nothing before it to charge
    volumes.stored["acme"] = 3000 * GIB
    assert run_pass(ledger_db, volumes, "2026-10-31T22:50:00").storage_charges == 0  # not due: sampled 20 min ago
    volumes.stored["acme"] = 2000 * GIB
    third = run_pass(ledger_db, volumes, "2026-11-01T01:10:00")
    # What was kept from 22:30 is what the 22:30 pass saw (1000 GiB), cut at each hour and at the month's end.
    tenth = 16_666_666  # 1000 GiB for 600 s: 0.0166666...; each row rounds down to the nano
    assert charges(ledger_db, "acme") == [
        ("2026-10", "2026-10-31T22:30:00+00:00", "2026-10-31T23:00:00+00:00", 1000 * GIB, 50_000_000),
        ("2026-10", "2026-10-31T23:00:00+00:00", "2026-11-01T00:00:00+00:00", 1000 * GIB, 100_000_000),
        ("2026-11", "2026-11-01T00:00:00+00:00", "2026-11-01T01:00:00+00:00", 1000 * GIB, 100_000_000),
        ("2026-11", "2026-11-01T01:00:00+00:00", "2026-11-01T01:10:00+00:00", 1000 * GIB, tenth),
    ]
    assert (third.storage_charges, third.storage_amount_nanos) == (4, 250_000_000 + tenth)
    assert charges(ledger_db, "other") == []
    # The same pass again, or one whose clock is behind, charges nothing twice.
    assert run_pass(ledger_db, volumes, "2026-11-01T01:10:00").storage_charges == 0
    assert run_pass(ledger_db, volumes, "2026-11-01T00:40:00").storage_charges == 0
    assert len(charges(ledger_db, "acme")) == 4

    october = invoice(ledger_db, "acme", "2026-10")
    assert october[0][-1] == "gib_hours"
    assert october[1] == [
        "storage", "", "", "storage", "", "", "2026-10-31T22:30:00Z", "2026-11-01T00:00:00Z", "5400", "", "0.072", "0.15",
        "USD", "", "", "1500.000",
    ]
    assert october[-1][0] == "total" and october[-1][11] == "0.15"
    november = invoice(ledger_db, "acme", "2026-11")
    assert november[1][6:12] == ["2026-11-01T00:00:00Z", "2026-11-01T01:10:00Z", "4200", "", "0.072", "0.12"]
    assert november[1][-1] == "1166.667"
    assert november[-1][11] == "0.12"  # 0.116666666 rounds once, on its line
    # Spend counts storage: budgets, credit and alerts see it with no code of their own.
    ledger_db.assert_spend_exact()
    with ledger_db.sessions() as session:
        shown = usage(session, "acme", "2026-11", "USD", utc("2026-11-01T02:00:00"))
    assert shown["charges"] == "0.12" and shown["total"] == "0.12"
    assert shown["storage_billed"] == {"byte_seconds": 1000 * GIB * 4200, "gib_hours": "1166.667", "amount": "0.116666666"}
    # The operator report's month says what the invoices say: storage apart, and in the net.
    with ledger_db.sessions() as session:
        report = build_report(session, NoCluster(), ledger_db.settings, utc("2026-11-01T00:00:00"), utc("2026-12-01T00:00:00"),
                              utc("2026-12-02T00:00:00"))  # type: ignore[arg-type]
    assert (cents_text(report.revenue.storage), cents_text(report.revenue.net)) == ("0.12", "0.12")
    assert [(line.account, line.gib_hours, cents_text(line.amount)) for line in report.storage_by_account] == [("acme", "1166.667", "0.12")]


def test_storage_is_free_until_priced_and_a_price_cannot_rewrite_what_is_billed(ledger_db: LedgerDb) -> None:
    ledger_db.add_account("acme")
    volumes = Volumes()
    volumes.stored["acme"] = 500 * GIB
    run_pass(ledger_db, volumes, "2026-11-02T10:00:00")
    run_pass(ledger_db, volumes, "2026-11-02T11:00:00")
    assert [row[4] for row in charges(ledger_db, "acme")] == [0]  # recorded at no price, and never charged again
    refused = ledger_db.cli("price", "set", "storage", "0.05", "--from", "2026-11-02T10:30:00")
    assert refused.returncode != 0
    assert "storage up to 2026-11-02T11:00:00Z is already billed" in refused.stderr
    assert ledger_db.cli("price", "set", "storage", "0.05", "--from", "2026-11-02T11:00:00").returncode == 0
    listed = ledger_db.cli("price", "list").stdout.splitlines()
    assert "storage\t2026-11-02T11:00:00Z\t0.05\tper-GiB-month" in listed
    assert ledger_db.cli("price", "set", "storage", "0.05", "--tier", "spot").returncode == 2
    run_pass(ledger_db, volumes, "2026-11-02T12:00:00")
    # 500 GiB for an hour at 0.05 per GiB-month (720 hours): 0.034722222 (and a fraction of a nano, dropped).
    assert [row[4] for row in charges(ledger_db, "acme")] == [0, 34_722_222]
    lines = invoice(ledger_db, "acme", "2026-11")
    assert [(line[0], line[10], line[11]) for line in lines[1:]] == [("storage", "0.00", "0.00"), ("storage", "0.05", "0.03"), ("total", "", "0.03")]


@pytest.mark.parametrize("statement", ["UPDATE storage_charges SET amount_nanos = 0", "DELETE FROM storage_charges"])
def test_a_storage_charge_is_never_changed_nor_removed(ledger_db: LedgerDb, statement: str) -> None:
    ledger_db.add_account("acme")
    volumes = Volumes()
    volumes.stored["acme"] = GIB
    run_pass(ledger_db, volumes, "2026-11-02T10:00:00")
    run_pass(ledger_db, volumes, "2026-11-02T11:00:00")
    with pytest.raises(DBAPIError, match="storage_charges is append-only"), ledger_db.engine.begin() as connection:
        connection.execute(text(statement))
    assert len(charges(ledger_db, "acme")) == 1


def test_a_site_without_storage_samples_nothing(ledger_db: LedgerDb) -> None:
    ledger_db.add_account("acme")
    volumes = Volumes()
    volumes.stored["acme"] = GIB
    slurm = SlurmClient(ledger_db.settings, runner=sacct_without_runs)
    assert not ledger_db.settings.storage_root
    passes.run_pass(ledger_db.sessions, slurm, ledger_db.settings, now=utc("2026-11-02T10:00:00"), measure_storage=volumes)
    with ledger_db.sessions() as session:
        assert session.scalars(select(StorageSample)).all() == []
