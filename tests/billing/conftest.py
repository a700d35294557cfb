"""Billing tests commit for real (passes own their transactions, and two run at once),
so each module gets its own PostgreSQL database, or SQLite file, dropped afterwards."""

from __future__ import annotations

import datetime as dt
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import sessionmaker

from billing.prices import set_price
from gpupool import db
from gpupool.config import Settings
from gpupool.models import (
    Account,
    AccountSpend,
    Adjustment,
    BillingState,
    Job,
    LedgerEntry,
    MemberIdentity,
    MemberSpend,
    StorageCharge,
)
from tests.conftest import JWT_SECRET, REPO, base_settings, create_database, drop_database

GPUPOOL = str(Path(sys.executable).parent / "gpupool")
RTX4090_NANOS = 120_000  # 0.00012 per GPU-second
RTX3090_NANOS = 70_000


@dataclass
class LedgerDb:
    url: str
    engine: Engine
    sessions: sessionmaker
    settings: Settings

    def environment(self, **env: str) -> dict[str, str]:
        """What cron gives the ``gpupool`` command: little but this database's settings."""
        return {
            "PATH": "/usr/bin:/bin",
            "TZ": "UTC",
            "GPUPOOL_DATABASE_URL": self.url,
            "GPUPOOL_JWT_SECRET": JWT_SECRET,
            "GPUPOOL_TEMPLATES_DIR": str(REPO / "slurm_templates"),
            "GPUPOOL_BILLING_ARCHIVE_DIR": self.settings.billing_archive_dir,
            # Billing's commands connect as the billing role where the settings name one (RolesDb.as_billing).
            **({"GPUPOOL_BILLING_DATABASE_URL": self.settings.billing_database_url} if self.settings.billing_database_url else {}),
            **env,
        }

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([GPUPOOL, *args], env=self.environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def cli(self, *args: str, timeout_s: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        """The operator's ``gpupool`` command against this database, as cron would run it."""
        return subprocess.run(
            [GPUPOOL, *args], env=self.environment(**env), capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def ledger(self, account: str | None = None) -> list[tuple]:
        """Every ledger row but its id and pass, in a fixed order."""
        entry = LedgerEntry
        query = select(
            entry.account, entry.cluster, entry.slurm_job_id, entry.job_id_raw, entry.run_start, entry.gpupool_job_id,
            entry.job_name, entry.state, entry.gpu_type, entry.gpus, entry.period, entry.interval_from, entry.interval_to,
            entry.seconds, entry.gpu_seconds, entry.unit_price_nanos, entry.amount_nanos,
        ).order_by(entry.cluster, entry.job_id_raw, entry.run_start, entry.gpu_type, entry.interval_from)
        if account is not None:
            query = query.where(entry.account == account)
        with self.engine.connect() as connection:
            return [tuple(row) for row in connection.execute(query)]

    def assert_spend_exact(self) -> None:
        assert spend_totals(self.engine) == spend_sums(self.engine)
        assert member_spend_totals(self.engine) == member_spend_sums(self.engine)

    def mark(self) -> dt.datetime | None:
        with self.sessions() as session:
            return session.scalar(select(BillingState.mark))

    def add_account(self, name: str, **budget: int | None) -> None:
        with self.sessions() as session, session.begin():
            session.merge(Account(name=name, gpu_limit=4, **budget))


def spend_totals(engine: Engine) -> dict[tuple[str, str], tuple[int, int]]:
    """``account_spend`` as the triggers keep it: (account, period) -> (ledger, adjustments)."""
    query = select(AccountSpend.account, AccountSpend.period, AccountSpend.ledger_nanos, AccountSpend.adjustment_nanos)
    with engine.connect() as connection:
        return {(account, period): (ledger, adjusted) for account, period, ledger, adjusted in connection.execute(query)}


def spend_sums(engine: Engine) -> dict[tuple[str, str], tuple[int, int]]:
    """The same, summed from every ledger row and adjustment: what the totals must equal."""
    sums: dict[tuple[str, str], list[int]] = {}
    with engine.connect() as connection:
        # Storage charges add to the ledger's total, as GPU rows do (migration 0029).
        for index, model in ((0, LedgerEntry), (0, StorageCharge), (1, Adjustment)):
            query = select(model.account, model.period, func.sum(model.amount_nanos)).group_by(model.account, model.period)
            for account, period, nanos in connection.execute(query):
                sums.setdefault((account, period), [0, 0])[index] += int(nanos)
    return {key: (ledger, adjusted) for key, (ledger, adjusted) in sums.items()}


def member_spend_totals(engine: Engine) -> dict[tuple[str, str, str], int]:
    """``member_spend`` as the trigger keeps it: (account, subject, period) -> ledger nanos."""
    query = select(MemberSpend.account, MemberSpend.subject, MemberSpend.period, MemberSpend.ledger_nanos)
    with engine.connect() as connection:
        return {(account, subject, period): nanos for account, subject, period, nanos in connection.execute(query)}


def member_spend_sums(engine: Engine) -> dict[tuple[str, str, str], int]:
    """The same, summed from the ledger rows of each member's API jobs in their account, and of the jobs
    their own Unix user ran around the API (``member_user``): what the totals must equal."""
    api_jobs = (
        select(LedgerEntry.account, Job.owner, LedgerEntry.period, func.sum(LedgerEntry.amount_nanos))
        .join(Job, (Job.id == LedgerEntry.gpupool_job_id) & (Job.account == LedgerEntry.account))
        .group_by(LedgerEntry.account, Job.owner, LedgerEntry.period)
    )
    direct = (
        select(LedgerEntry.account, MemberIdentity.subject, LedgerEntry.period, func.sum(LedgerEntry.amount_nanos))
        .join(
            MemberIdentity,
            (MemberIdentity.account == LedgerEntry.account) & (MemberIdentity.unix_user == LedgerEntry.member_user),
        )
        .outerjoin(Job, (Job.id == LedgerEntry.gpupool_job_id) & (Job.account == LedgerEntry.account))
        .where(Job.id.is_(None))
        .group_by(LedgerEntry.account, MemberIdentity.subject, LedgerEntry.period)
    )
    sums: dict[tuple[str, str, str], int] = {}
    with engine.connect() as connection:
        for query in (api_jobs, direct):
            for account, subject, period, nanos in connection.execute(query):
                sums[(account, subject, period)] = sums.get((account, subject, period), 0) + int(nanos)
    return sums


def _prepare(url: str, archive: Path) -> LedgerDb:
    engine = db.make_engine(url)
    sessions = db.make_session_factory(engine)
    with sessions() as session, session.begin():
        set_price(session, "rtx4090", RTX4090_NANOS, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        set_price(session, "rtx3090", RTX3090_NANOS, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    settings = base_settings(database_url=url, billing_archive_dir=str(archive))
    return LedgerDb(url=url, engine=engine, sessions=sessions, settings=settings)


@pytest.fixture(scope="module")
def pg_ledger(tmp_path_factory: pytest.TempPathFactory, job_root: Path, runas_socket: str) -> Iterator[LedgerDb]:
    name = f"gpupool_bill_{secrets.token_hex(4)}"
    ledger = _prepare(create_database(name), tmp_path_factory.mktemp("archive"))
    # API jobs of these tests run as their tenant, through the session's run-as helper.
    ledger.settings = ledger.settings.replace(job_root=str(job_root), runas_socket=runas_socket)
    yield ledger
    ledger.engine.dispose()
    drop_database(name)


@pytest.fixture(params=["postgresql", "sqlite"])
def ledger_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerDb]:
    """A fresh, migrated, priced ledger per test, on each backend."""
    if request.param == "postgresql":
        name = f"gpupool_bill_{secrets.token_hex(4)}"
        url = create_database(name)
    else:
        url = f"sqlite:///{tmp_path}/ledger.db"
        engine = db.make_engine(url)
        db.upgrade(engine)
        engine.dispose()
    ledger = _prepare(url, tmp_path / "archive")
    yield ledger
    ledger.engine.dispose()
    if request.param == "postgresql":
        drop_database(name)
