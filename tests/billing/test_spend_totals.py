"""The spend totals the database keeps (``account_spend``, migration 0024; ``member_spend``, 0025) equal
the sums of the rows they count, for every account (and member) and period, however the rows came:
replayed passes (COPY on PostgreSQL), failed-node credits, operator adjustments, passes at once, and the
migrations' backfill of old rows."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Connection, Engine, insert, inspect, select, text
from sqlalchemy.exc import DBAPIError

from bench.synthetic_sacct import SyntheticJob, sacct_dump, synthetic_jobs
from billing import passes
from billing.budgets import balance, lock_budget, member_spent_nanos
from billing.prices import set_price
from gpupool import db
from gpupool.models import Account, Adjustment, BillingPass, Job, LedgerEntry, MemberIdentity
from tests.billing.conftest import (
    RTX4090_NANOS,
    LedgerDb,
    member_spend_sums,
    member_spend_totals,
    spend_sums,
    spend_totals,
)
from tests.billing.test_ledger import dump, replay_ok, row
from tests.billing.test_replay_import import UNTYPED_NANOS, XDMOD_LOGS
from tests.support.sacct_dumps import as_pass_output

RECORDED = Path(__file__).resolve().parent.parent / "unit" / "fixtures" / "sacct" / "requeue-array-pipe.psv"
TRES = "cpu=1,gres/gpu:rtx4090=2,gres/gpu=2"


def adjust(ledger: LedgerDb, account: str, amount: str, period: str) -> None:
    result = ledger.cli("adjust", "--account", account, "--amount", amount, "--reason", "test", "--period", period)
    assert result.returncode == 0, result.stderr


def months(tmp_path: Path, name: str, start: dt.datetime, count: int, seed: int) -> Path:
    """A synthetic month of ``count`` jobs of 5 accounts from ``start``; its last days run into the next month."""
    path = tmp_path / name
    path.write_text(sacct_dump(list(synthetic_jobs(count, seed=seed, month_start=start, accounts=5))))
    return path


def test_replays_credits_and_adjustments_keep_every_total_and_balance_exact(ledger_db: LedgerDb, tmp_path: Path) -> None:
    with ledger_db.sessions() as session, session.begin():
        set_price(session, "*", UNTYPED_NANOS, dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    accounts = [f"acct{index:03d}" for index in range(5)]
    for name in accounts:
        ledger_db.add_account(name, prepaid_credit_nanos=10**12, monthly_limit_nanos=10**11)
    # Other sites' recorded dumps (when the shared folder has them) and one recorded on our cluster,
    # under the pass's delimiter (under '|' its job name's newline refuses it).
    for path in XDMOD_LOGS:
        assert ledger_db.cli("billing", "replay", "--format", "xdmod", str(path)).returncode == 0, path
    recorded = tmp_path / "recorded.psv"
    recorded.write_text(as_pass_output(RECORDED.read_text().rstrip("\n").split("\n")))
    replay_ok(ledger_db, recorded)
    ledger_db.assert_spend_exact()
    replay_ok(ledger_db, months(tmp_path, "nov.psv", dt.datetime(2026, 11, 5, tzinfo=dt.UTC), 2_000, 5))
    replay_ok(ledger_db, months(tmp_path, "dec.psv", dt.datetime(2026, 12, 1, tzinfo=dt.UTC), 2_000, 6))
    # A failed node's run: charged, then credited back by the same pass (an adjustment billing writes).
    failed = row(9, "acct001", "NODE_FAIL", "2026-11-03T00:00:00", "2026-11-03T01:00:00", 3600, TRES)
    replay_ok(ledger_db, dump(tmp_path, "f.psv", failed))
    adjust(ledger_db, "acct000", "-1.005", "2026-11")
    adjust(ledger_db, "acct000", "2.5", "2026-10")
    adjust(ledger_db, "acct004", "0.000000001", "2027-01")
    totals = spend_totals(ledger_db.engine)
    assert totals == spend_sums(ledger_db.engine)
    assert {period for _, period in totals} >= {"2026-10", "2026-11", "2026-12", "2027-01"}
    assert totals[("acct001", "2026-11")][1] == -2 * 3600 * RTX4090_NANOS
    # What budgets answer is what the rows sum to, to the nano, ever and in each month.
    sums = spend_sums(ledger_db.engine)
    with ledger_db.sessions() as session:
        for account in accounts:
            mine = {period: ledger + adjusted for (owner, period), (ledger, adjusted) in sums.items() if owner == account}
            for now in (dt.datetime(year, month, 2, tzinfo=dt.UTC) for year, month in ((2026, 11), (2027, 1), (2030, 1))):
                found = balance(session, account, now)
                assert found.spent_total_nanos == sum(mine.values())
                assert found.spent_period_nanos == mine.get(f"{now:%Y-%m}", 0)
                assert lock_budget(session, account, now).balance == found
                session.rollback()


def test_two_passes_and_adjustments_at_once_leave_the_totals_exact(ledger_db: LedgerDb, tmp_path: Path) -> None:
    for index in range(5):
        ledger_db.add_account(f"acct{index:03d}")
    path = months(tmp_path, "jobs.psv", dt.datetime(2026, 11, 20, tzinfo=dt.UTC), 5_000, 3)
    running = [ledger_db.start("billing", "replay", str(path)) for _ in range(2)]
    adjusted = {(f"acct{index:03d}", f"2026-1{1 + index % 2}") for index in range(5)}
    running += [
        ledger_db.start("adjust", "--account", account, "--amount", "-0.5", "--reason", "at once", "--period", period)
        for account, period in sorted(adjusted)
    ]
    outputs = [process.communicate(timeout=180) for process in running]
    assert [process.returncode for process in running] == [0] * len(running), outputs
    totals = spend_totals(ledger_db.engine)
    assert totals == spend_sums(ledger_db.engine)
    assert {key: totals[key][1] for key in adjusted} == dict.fromkeys(adjusted, -500_000_000)


@pytest.mark.parametrize("ledger_db", ["postgresql"], indirect=True)
def test_copy_replay_keeps_the_totals_exact(ledger_db: LedgerDb, tmp_path: Path) -> None:
    """bench/billing.py's path: ``passes.replay``, its rows streamed in by COPY, one trigger call per COPY."""
    first = months(tmp_path, "a.psv", dt.datetime(2026, 10, 10, tzinfo=dt.UTC), 20_000, 1)
    second = months(tmp_path, "b.psv", dt.datetime(2026, 10, 25, tzinfo=dt.UTC), 20_000, 2)
    for path in (first, second, first):  # the last adds nothing: an empty COPY
        passes.replay(ledger_db.sessions, ledger_db.settings, path)
    with ledger_db.sessions() as session:
        assert session.scalars(select(BillingPass.ledger_rows).order_by(BillingPass.id)).all()[-1] == 0
    totals = spend_totals(ledger_db.engine)
    assert len(totals) == 10  # 5 accounts, October and November
    assert totals == spend_sums(ledger_db.engine)


# --- each member's spend ----------------------------------------------------------------------


def api_job(job_id: str, account: str, owner: str, *, slurm_job_id: int | None = None, created_at: dt.datetime | None = None) -> dict[str, object]:
    """A job row as POST /submit leaves it once Slurm took the job."""
    when = created_at or db.utcnow()
    return {
        "id": job_id, "account": account, "owner": owner, "name": "j", "template": "hello", "params": {}, "gpus": 1,
        "cpus": 1, "mem_gb": 1, "time_limit_min": 60, "job_dir": "/nonexistent", "state": "COMPLETED", "finished": True,
        "request_hash": "0" * 64, "slurm_job_id": slurm_job_id, "created_at": when, "updated_at": when,
    }


def new_pass(connection: Connection) -> int:
    now = db.utcnow()
    return connection.execute(
        insert(BillingPass).values(
            kind="replay", started_at=now, finished_at=now, source="test", source_sha256="", sacct_rows=0, ledger_rows=0,
            adjustment_rows=0,
        )
    ).inserted_primary_key[0]


def ledger_entry(pass_id: int, job_id_raw: int, account: str, period: str, amount: int, gpupool_job_id: str | None) -> dict[str, object]:
    start = dt.datetime(2026, 10, 31, 23, tzinfo=dt.UTC)
    return {
        "pass_id": pass_id, "account": account, "cluster": "gpupool", "slurm_job_id": str(job_id_raw), "job_id_raw": job_id_raw,
        "run_start": start, "gpupool_job_id": gpupool_job_id, "job_name": "job", "state": "COMPLETED", "gpu_type": "rtx4090",
        "gpus": 1, "period": period, "interval_from": start, "interval_to": start, "seconds": 1, "gpu_seconds": 1,
        "unit_price_nanos": amount, "amount_nanos": amount, "correction": amount < 0, "final": True,
    }


# Ledger rows of API jobs: two of alice's and one of bob's in acme, one of another alice's in zeta;
# a row of no API job (sacct's own); and a row naming acme's job under zeta, which is nobody's.
MEMBER_JOBS = [("a1", "acme", "alice"), ("a2", "acme", "alice"), ("b1", "acme", "bob"), ("z1", "zeta", "alice")]
MEMBER_ROWS = [
    ("acme", "2026-11", 7, "a1"), ("acme", "2026-12", -3, "a1"), ("acme", "2026-11", 5, "b1"), ("acme", "2026-11", 13, None),
    ("acme", "2026-11", 2**40, "a2"), ("zeta", "2026-11", 11, "z1"), ("zeta", "2026-11", 17, "a1"),
]
MEMBER_EXPECTED = {
    ("acme", "alice", "2026-11"): 7 + 2**40, ("acme", "alice", "2026-12"): -3, ("acme", "bob", "2026-11"): 5,
    ("zeta", "alice", "2026-11"): 11,
}


def test_each_members_total_is_what_their_api_jobs_were_billed(ledger_db: LedgerDb) -> None:
    with ledger_db.engine.begin() as connection:
        now = db.utcnow()
        connection.execute(insert(Account), [{"name": name, "created_at": now} for name in ("acme", "zeta")])
        connection.execute(insert(Job), [api_job(*job) for job in MEMBER_JOBS])
        pass_id = new_pass(connection)
        rows = [ledger_entry(pass_id, index, *entry) for index, entry in enumerate(MEMBER_ROWS)]
        # Two statements: the second adds to totals the first made.
        connection.execute(insert(LedgerEntry), rows[:4])
        connection.execute(insert(LedgerEntry), rows[4:])
    assert member_spend_totals(ledger_db.engine) == member_spend_sums(ledger_db.engine) == MEMBER_EXPECTED
    # What a member's limit and GET /account/members read.
    with ledger_db.sessions() as session:
        assert member_spent_nanos(session, "acme", "alice", "2026-11") == 7 + 2**40
        assert member_spent_nanos(session, "acme", "bob", "2026-12") == 0
        assert member_spent_nanos(session, "acme", "carol", "2026-11") == 0
        lock = lock_budget(session, "acme", dt.datetime(2026, 11, 15, tzinfo=dt.UTC), member="alice")
        assert lock.member_spent_nanos == 7 + 2**40
        session.rollback()


@pytest.mark.parametrize("ledger_db", ["postgresql"], indirect=True)
def test_a_members_own_users_jobs_around_the_api_count_in_their_spend(ledger_db: LedgerDb) -> None:
    """Rows the billing pass marks with a member's own user (``member_user``, migration 0027) count for that member."""
    with ledger_db.engine.begin() as connection:
        now = db.utcnow()
        connection.execute(insert(Account), [{"name": name, "created_at": now} for name in ("acme", "zeta")])
        connection.execute(insert(MemberIdentity), [
            {"account": "acme", "subject": "alice", "unix_user": "gp-200001-acme", "unix_uid": 200001, "created_at": now},
            {"account": "zeta", "subject": "alice", "unix_user": "gp-200002-zeta", "unix_uid": 200002, "created_at": now},
        ])
        connection.execute(insert(Job), [api_job("a1", "acme", "alice")])
        pass_id = new_pass(connection)
        rows = [
            # alice's direct sbatch in acme, and her API job (counted once, as the API job's)
            ledger_entry(pass_id, 1, "acme", "2026-11", 11, None) | {"member_user": "gp-200001-acme"},
            ledger_entry(pass_id, 2, "acme", "2026-11", 7, "a1") | {"member_user": "gp-200001-acme"},
            # acme's member user under zeta, a user no identity has, and the account's own user: nobody's
            ledger_entry(pass_id, 3, "zeta", "2026-11", 13, None) | {"member_user": "gp-200001-acme"},
            ledger_entry(pass_id, 4, "acme", "2026-11", 17, None) | {"member_user": "gp-209999-acme"},
            ledger_entry(pass_id, 5, "acme", "2026-11", 19, None) | {"member_user": None},
            # her direct job in zeta, in the next statement, on the total the first made
            ledger_entry(pass_id, 6, "zeta", "2026-12", 23, None) | {"member_user": "gp-200002-zeta"},
            ledger_entry(pass_id, 7, "acme", "2026-11", 29, None) | {"member_user": "gp-200001-acme"},
        ]
        connection.execute(insert(LedgerEntry), rows[:5])
        connection.execute(insert(LedgerEntry), rows[5:])
    expected = {("acme", "alice", "2026-11"): 11 + 7 + 29, ("zeta", "alice", "2026-12"): 23}
    assert member_spend_totals(ledger_db.engine) == member_spend_sums(ledger_db.engine) == expected
    ledger_db.assert_spend_exact()


def test_a_copy_replay_of_api_jobs_keeps_each_members_total_exact(ledger_db: LedgerDb, tmp_path: Path) -> None:
    """Billing's own path: sacct rows matched to API jobs by their Slurm ids, streamed in by COPY, one trigger call."""
    jobs: list[SyntheticJob] = list(synthetic_jobs(3_000, seed=4, month_start=dt.datetime(2026, 10, 20, tzinfo=dt.UTC), accounts=5))
    for index in range(5):
        ledger_db.add_account(f"acct{index:03d}")
    with ledger_db.engine.begin() as connection:
        # Three members submit three quarters of the jobs through the API; the rest came by sbatch.
        connection.execute(
            insert(Job),
            [
                api_job(f"job-{job.job_id}", job.account, f"member{job.job_id % 3}", slurm_job_id=job.job_id, created_at=job.submit)
                for job in jobs if job.job_id % 4
            ],
        )
    path = tmp_path / "jobs.psv"
    path.write_text(sacct_dump(jobs))
    passes.replay(ledger_db.sessions, ledger_db.settings, path)
    totals = member_spend_totals(ledger_db.engine)
    assert {subject for _, subject, _ in totals} == {"member0", "member1", "member2"}
    assert {period for _, _, period in totals} == {"2026-10", "2026-11"}
    assert totals == member_spend_sums(ledger_db.engine)
    ledger_db.assert_spend_exact()


# --- the migrations ------------------------------------------------------------------------


def adjustment(account: str, period: str, nanos: int) -> dict[str, object]:
    """An operator's adjustment row, as ``gpupool adjust`` writes it."""
    return {
        "account": account, "period": period, "amount_nanos": nanos, "reason": "r", "kind": "manual", "created_by": "op",
        "created_at": db.utcnow(),
    }


@pytest.fixture
def at_0023(ledger_db: LedgerDb) -> Engine:
    """The test's database (on each backend) taken back to the revision before the totals: 0024's downgrade."""
    with ledger_db.engine.begin() as connection:
        command.downgrade(db.alembic_config(connection=connection), "0023")
    return ledger_db.engine


def test_the_migration_fills_the_totals_from_the_rows_already_there(at_0023: Engine) -> None:
    assert "account_spend" not in inspect(at_0023).get_table_names()
    start = dt.datetime(2026, 10, 31, 23, tzinfo=dt.UTC)
    with at_0023.begin() as connection:
        now = db.utcnow()
        connection.execute(insert(Account), [{"name": name, "created_at": now} for name in ("acme", "zeta")])
        pass_id = connection.execute(
            insert(BillingPass).values(
                kind="replay", started_at=now, finished_at=now, source="test", source_sha256="", sacct_rows=0, ledger_rows=0,
                adjustment_rows=0,
            )
        ).inserted_primary_key[0]
        ledger_rows = [
            {
                "pass_id": pass_id, "account": account, "cluster": "gpupool", "slurm_job_id": str(job), "job_id_raw": job,
                "run_start": start, "gpupool_job_id": None, "job_name": "job", "state": "COMPLETED", "gpu_type": "rtx4090",
                "gpus": 1, "period": period, "interval_from": start, "interval_to": start, "seconds": 1, "gpu_seconds": 1,
                "unit_price_nanos": amount, "amount_nanos": amount, "correction": amount < 0, "final": True,
            }
            for job, (account, period, amount) in enumerate(
                [("acme", "2026-10", 7), ("acme", "2026-10", 2**40), ("acme", "2026-11", -3), ("zeta", "2026-11", 0),
                 ("acme", "2026-12", 5)]
            )
        ]
        connection.execute(insert(LedgerEntry), ledger_rows)
        connection.execute(insert(Adjustment), [adjustment("acme", "2026-10", -11), adjustment("zeta", "2027-01", 13)])
    db.upgrade(at_0023)
    expected = {
        ("acme", "2026-10"): (7 + 2**40, -11), ("acme", "2026-11"): (-3, 0), ("acme", "2026-12"): (5, 0),
        ("zeta", "2026-11"): (0, 0), ("zeta", "2027-01"): (0, 13),
    }
    assert spend_totals(at_0023) == spend_sums(at_0023) == expected
    # From now on the triggers add to what the backfill found.
    with at_0023.begin() as connection:
        connection.execute(insert(LedgerEntry), [{**ledger_rows[0], "job_id_raw": 99, "amount_nanos": 100}])
        connection.execute(insert(Adjustment).values(adjustment("acme", "2026-10", 1)))
    assert spend_totals(at_0023)[("acme", "2026-10")] == (107 + 2**40, -10)
    assert spend_totals(at_0023) == spend_sums(at_0023)


def test_adjustments_are_append_only_on_both_backends(at_0023: Engine) -> None:
    db.upgrade(at_0023)
    with at_0023.begin() as connection:
        connection.execute(insert(Account).values(name="acme", created_at=db.utcnow()))
        connection.execute(insert(Adjustment).values(adjustment("acme", "2026-11", -5)))
    for statement, verb in (("UPDATE adjustments SET amount_nanos = 0", "UPDATE"), ("DELETE FROM adjustments", "DELETE")):
        with at_0023.begin() as connection, pytest.raises(DBAPIError) as caught:
            connection.execute(text(statement))
        assert f"adjustments is append-only: {verb} refused" in str(caught.value.orig)
    with at_0023.connect() as connection:
        assert connection.execute(select(Adjustment.amount_nanos)).scalar_one() == -5


def test_the_member_totals_migration_fills_them_from_the_rows_already_there(ledger_db: LedgerDb) -> None:
    engine = ledger_db.engine
    with engine.begin() as connection:
        command.downgrade(db.alembic_config(connection=connection), "0024")
    assert "member_spend" not in inspect(engine).get_table_names()
    with engine.begin() as connection:
        now = db.utcnow()
        connection.execute(insert(Account), [{"name": name, "created_at": now} for name in ("acme", "zeta")])
        connection.execute(insert(Job), [api_job(*job) for job in MEMBER_JOBS])
        pass_id = new_pass(connection)
        connection.execute(insert(LedgerEntry), [ledger_entry(pass_id, index, *entry) for index, entry in enumerate(MEMBER_ROWS)])
    db.upgrade(engine)
    assert member_spend_totals(engine) == member_spend_sums(engine) == MEMBER_EXPECTED
    # From now on the trigger adds to what the backfill found.
    with engine.begin() as connection:
        connection.execute(insert(LedgerEntry), [ledger_entry(pass_id, 99, "acme", "2026-11", 100, "b1")])
    assert member_spend_totals(engine)[("acme", "bob", "2026-11")] == 105
    ledger_db.assert_spend_exact()
