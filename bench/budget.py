"""bench/budget: the budget check of an account with 500,000 ledger rows.

The rows are generated inside PostgreSQL: the account's two years of charges
(one row per run, spread over 24 months, each run an API job of one of its
five members), as many rows of other accounts, and 1,000 of its adjustments.
Then, for that account, this script times ``lock_budget`` (the statement
every ``POST /submit`` of a budgeted account runs under its lock; in a
transaction rolled back each time), the same for a member with a monthly
limit of their own (the statement also reads what that member's jobs were
billed this month), and ``balance`` (what ``/usage``, spend alerts and
``push_budgets`` read), and prints the spend they read: runs of two versions
must print the same figures.

Usage: python -m bench.budget [--rows 500000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from collections.abc import Callable

from sqlalchemy import text

from bench._harness import filled_database, median, percentile, table
from billing.budgets import balance, lock_budget
from gpupool import db

FILL = """
INSERT INTO billing_passes (id, kind, started_at, finished_at, source, source_sha256, sacct_rows, ledger_rows, adjustment_rows)
VALUES (1, 'bench', now(), now(), 'bench', '', 0, 0, 0);
INSERT INTO accounts (name, gpu_limit, prepaid_credit_nanos, monthly_limit_nanos, created_at)
VALUES ('acme', NULL, 1000000000000000, 100000000000000, now());
INSERT INTO jobs (id, account, owner, name, template, params, gpus, cpus, mem_gb, time_limit_min, preemptible, job_dir,
    state, finished, request_hash, created_at, updated_at)
SELECT 'job-' || i, 'acme', 'member' || (i % 5), 'job', 'hello', '{}', 1, 1, 1, 60, false, '/nonexistent', 'COMPLETED',
       true, '', now(), now()
FROM generate_series(2, 2 * :rows, 2) AS i;
INSERT INTO ledger_entries (pass_id, account, cluster, slurm_job_id, job_id_raw, run_start, gpupool_job_id, job_name,
    state, gpu_type, gpus, period, interval_from, interval_to, seconds, gpu_seconds, unit_price_nanos, amount_nanos,
    correction, final)
SELECT 1, CASE WHEN i % 2 = 0 THEN 'acme' ELSE 'other' || (i % 101) END, 'gpupool', i::text, i, t,
       CASE WHEN i % 2 = 0 THEN 'job-' || i END, 'job',
       'COMPLETED', 'rtx4090', 1, to_char(t AT TIME ZONE 'UTC', 'YYYY-MM'), t, t + interval '60 seconds', 60, 60,
       120000, (1 + i % 997) * 120000, false, true
FROM (SELECT i, timestamptz '2025-01-01 00:00:00+00' + i * (interval '729 days' / (2 * :rows)) AS t
      FROM generate_series(1, 2 * :rows) AS i) AS g;
INSERT INTO adjustments (account, period, amount_nanos, reason, kind, created_by, created_at)
SELECT 'acme', to_char(timestamptz '2025-01-01 00:00:00+00' + (i % 24) * interval '1 month', 'YYYY-MM'),
       (i % 7 - 3) * 1000000, 'bench', 'manual', 'bench', now()
FROM generate_series(1, 1000) AS i;
ANALYZE
"""
NOW = dt.datetime(2026, 12, 15, tzinfo=dt.UTC)


def timed(call: Callable[[], None], repeat: int) -> list[float]:
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000, help="the account's ledger rows (as many again for others)")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    with filled_database(FILL, {"rows": args.rows}) as (_, engine), db.make_session_factory(engine)() as session:
        count = session.scalar(text("SELECT count(*) FROM ledger_entries WHERE account = 'acme'"))
        found = balance(session, "acme", NOW)

        member_spent = lock_budget(session, "acme", NOW, member="member1").member_spent_nanos
        session.rollback()

        def locked() -> None:
            lock_budget(session, "acme", NOW)
            session.rollback()

        def member_locked() -> None:
            lock_budget(session, "acme", NOW, member="member1")
            session.rollback()

        def read() -> None:
            balance(session, "acme", NOW)
            session.rollback()

        # Warm: the pool's connection, SQLAlchemy's compiled statements.
        timed(locked, 3)
        timed(member_locked, 3)
        timed(read, 3)
        lock_s = timed(locked, args.repeat)
        member_s = timed(member_locked, args.repeat)
        balance_s = timed(read, args.repeat)

    def ms(values: list[float]) -> str:
        return f"{median(values) * 1000:>8.2f} ms p50  {percentile(values, 0.95) * 1000:>8.2f} ms p95"

    table(
        f"bench/budget: an account with {count:,} ledger rows over 24 months, 1,000 adjustments ({args.repeat} runs)",
        [
            ("lock_budget (submit, under the lock)", ms(lock_s)),
            ("lock_budget, a member with a limit", ms(member_s)),
            ("balance (/usage, alerts, push_budgets)", ms(balance_s)),
            ("spent ever / this month (nanos)", f"{found.spent_total_nanos} / {found.spent_period_nanos}"),
            ("member1's spend this month (nanos)", str(member_spent)),
        ],
    )


if __name__ == "__main__":
    main()
