"""bench/billing: replay 100,000 synthetic sacct rows into PostgreSQL.

Two baselines, run in this same script on the same input:
- raw ``COPY`` of exactly the ledger rows the replay writes, into the same
  table: the physical limit (target: gpupool at >= 0.5 of its rate);
- ``../shared/baselines/seed-billing.sh``, the source article's shell
  pipeline. It forks two processes per row, so it runs on the first
  ``--seed-rows`` rows of the same input and its rate is compared.

Usage: python -m bench.billing [--rows 100000] [--repeat 3] [--seed-rows 2000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import secrets
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from bench._harness import REPO, table
from bench.support.metering import meter, parse_runs
from bench.support.services import create_database, drop_database
from bench.synthetic_sacct import PASS_DELIMITER, sacct_dump, seed_dump, synthetic_jobs
from billing import passes
from billing.ledger_writer import COPY_LEDGER_SQL, ledger_csv_lines
from billing.prices import load_prices, set_price
from gpupool import db
from gpupool.config import load_settings

SEED_SCRIPT = REPO.parent / "shared" / "baselines" / "seed-billing.sh"
APPEND_ONLY = ("ledger_entries", "adjustments")


def reset(engine: db.Engine) -> None:
    with engine.begin() as connection:
        # The bench's own throwaway database: its owner lifts the append-only triggers
        # for this one transaction, which gpupool itself never does, and empties the
        # spend totals with the rows they count.
        for table_name in APPEND_ONLY:
            connection.execute(text(f"ALTER TABLE {table_name} DISABLE TRIGGER {table_name}_no_truncate"))
        connection.execute(text(f"TRUNCATE billing_passes, account_spend, {', '.join(APPEND_ONLY)}"))
        for table_name in APPEND_ONLY:
            connection.execute(text(f"ALTER TABLE {table_name} ENABLE TRIGGER {table_name}_no_truncate"))
    with engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE ledger_entries"))


def time_copy(engine: db.Engine, dump: str) -> tuple[float, int]:
    """COPY of the very rows a replay writes, prepared before the clock starts."""
    with db.make_session_factory(engine)() as session, session.begin():
        prices = load_prices(session)
    rows = meter(parse_runs(dump, delimiter=PASS_DELIMITER).runs, {}, prices)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO billing_passes (id, kind, started_at, finished_at, source, source_sha256, sacct_rows, ledger_rows, adjustment_rows) "
                "VALUES (1, 'bench', now(), now(), 'bench', '', 0, 0, 0)"
            )
        )
    buffer = io.StringIO("".join(ledger_csv_lines(1, rows, lambda _run: None)))
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        started = time.perf_counter()
        cursor.copy_expert(COPY_LEDGER_SQL, buffer)
        raw.commit()
        elapsed = time.perf_counter() - started
    finally:
        raw.close()
    return elapsed, len(rows)


def time_replay(engine: db.Engine, settings: db.Any, path: Path) -> tuple[float, int]:
    sessions = db.make_session_factory(engine)
    started = time.perf_counter()
    report = passes.replay(sessions, settings, path)
    return time.perf_counter() - started, report.ledger_rows


def time_seed(seed_input: Path, out: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["bash", str(SEED_SCRIPT), str(seed_input), str(out)], check=True, timeout=3600)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed-rows", type=int, default=2_000)
    args = parser.parse_args()

    jobs = list(synthetic_jobs(args.rows, seed=1))
    name = f"gpupool_bench_{secrets.token_hex(4)}"
    url = create_database(name)
    try:
        engine = db.make_engine(url)
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            settings = load_settings(environ={}, overrides={"database_url": url, "billing_archive_dir": str(tmp / "archive")})
            with db.make_session_factory(engine)() as session, session.begin():
                for gpu_type, nanos in (("rtx4090", 120_000), ("rtx3090", 70_000)):
                    set_price(session, gpu_type, nanos, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
            dump_path = tmp / "sacct.psv"
            dump = sacct_dump(jobs)
            dump_path.write_text(dump)
            seed_input = tmp / "seed.psv"
            seed_input.write_text(seed_dump(jobs[: args.seed_rows]))

            copy_runs, replay_runs = [], []
            ledger_rows = 0
            for _ in range(args.repeat):  # interleaved, so drift hits both alike
                reset(engine)
                seconds, ledger_rows = time_copy(engine, dump)
                copy_runs.append(seconds)
                reset(engine)
                seconds, written = time_replay(engine, settings, dump_path)
                assert written == ledger_rows, (written, ledger_rows)
                replay_runs.append(seconds)
            seed_seconds = time_seed(seed_input, tmp / "seed.csv")
        engine.dispose()
    finally:
        drop_database(name)

    copy_rate = ledger_rows / statistics.median(copy_runs)
    replay_rate = ledger_rows / statistics.median(replay_runs)
    sacct_rate = args.rows / statistics.median(replay_runs)
    seed_rate = args.seed_rows / seed_seconds
    table(
        f"bench/billing: {args.rows:,} sacct rows -> {ledger_rows:,} ledger rows (median of {args.repeat})",
        [
            ("raw COPY of the ledger rows", f"{copy_rate:>12,.0f} rows/s  ({statistics.median(copy_runs):.2f} s)"),
            ("gpupool billing replay", f"{replay_rate:>12,.0f} rows/s  ({statistics.median(replay_runs):.2f} s; {sacct_rate:,.0f} sacct rows/s)"),
            (f"seed-billing.sh ({args.seed_rows:,} rows)", f"{seed_rate:>12,.0f} rows/s  ({seed_seconds:.1f} s)"),
            ("replay / COPY", f"{replay_rate / copy_rate:.2f}  (target >= 0.50)"),
            ("replay / seed-billing.sh", f"{sacct_rate / seed_rate:,.0f}x"),
        ],
    )


if __name__ == "__main__":
    main()
