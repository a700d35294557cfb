"""The ledger on PostgreSQL and SQLite, fed by replayed sacct output through the operator's CLI."""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from bench.synthetic_sacct import sacct_dump, synthetic_jobs
from billing.money import format_nanos
from billing.sacct import PASS_FIELDS, SACCT_FIELDS
from gpupool.models import Adjustment, BillingPass, Job, LedgerEntry
from tests.billing.conftest import RTX3090_NANOS, RTX4090_NANOS, LedgerDb
from tests.conftest import wait_for
from tests.support.sacct_dumps import as_pass_output

HEADER = "|".join(SACCT_FIELDS)


def dump(tmp_path: Path, name: str, *rows: str) -> Path:
    path = tmp_path / name
    path.write_text(as_pass_output([HEADER, *rows]))
    return path


def row(job: int, account: str, state: str, start: str, end: str, elapsed: int, tres: str, name: str = "job") -> str:
    return "|".join(["gpupool", str(job), str(job), account, "alice", state, start, start, end, str(elapsed), tres, name])


def replay_ok(ledger: LedgerDb, path: Path) -> str:
    result = ledger.cli("billing", "replay", str(path))
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_replay_bills_each_run_once_and_a_rerun_adds_nothing(ledger_db: LedgerDb, tmp_path: Path) -> None:
    jobs = list(synthetic_jobs(300, accounts=3))
    path = tmp_path / "month.psv"
    path.write_text(sacct_dump(jobs))
    first = replay_ok(ledger_db, path)
    assert "300 sacct rows" in first
    rows = ledger_db.ledger()
    billable = [job for job in jobs if job.start is not None]
    assert {r[3] for r in rows} == {job.job_id for job in billable}
    # The invariant: per finished run, GPU-seconds = GPUs x ElapsedRaw, at its type's price.
    for job in billable:
        mine = [r for r in rows if r[3] == job.job_id]
        assert sum(r[14] for r in mine) == job.gpus * job.elapsed_s
        price = RTX4090_NANOS if job.gpu_type == "rtx4090" else RTX3090_NANOS
        assert sum(r[16] for r in mine) == job.gpus * job.elapsed_s * price
        assert mine[0][11] == job.start and mine[-1][12] == job.start + dt.timedelta(seconds=job.elapsed_s)
    assert "0 ledger rows" in replay_ok(ledger_db, path)
    # The archived copy (gzip) of what was billed replays to nothing new as well.
    with ledger_db.sessions() as session:
        archived = session.scalars(select(BillingPass.archive_path).order_by(BillingPass.id)).first()
    assert archived and archived.endswith(".psv.gz")
    assert "0 ledger rows" in replay_ok(ledger_db, Path(archived))
    assert ledger_db.ledger() == rows
    ledger_db.assert_spend_exact()


def test_month_boundary_split_from_replayed_outputs(ledger_db: LedgerDb, tmp_path: Path) -> None:
    """A 2-GPU job running across midnight Oct 31 UTC, seen running by one pass and finished by the next."""
    ledger_db.add_account("acme")
    tres = "cpu=1,gres/gpu:rtx4090=2,gres/gpu=2"
    running = dump(tmp_path, "a.psv", row(77, "acme", "RUNNING", "2026-10-31T23:00:00", "Unknown", 1800, tres))
    finished = dump(tmp_path, "b.psv", row(77, "acme", "COMPLETED", "2026-10-31T23:00:00", "2026-11-01T01:30:00", 9000, tres))
    replay_ok(ledger_db, running)
    replay_ok(ledger_db, finished)
    replay_ok(ledger_db, running)  # an old pass replayed late changes nothing
    spans = [(r[10], r[11].isoformat(), r[12].isoformat(), r[13], r[14]) for r in ledger_db.ledger("acme")]
    assert spans == [
        ("2026-10", "2026-10-31T23:00:00+00:00", "2026-10-31T23:30:00+00:00", 1800, 3600),
        ("2026-10", "2026-10-31T23:30:00+00:00", "2026-11-01T00:00:00+00:00", 1800, 3600),
        ("2026-11", "2026-11-01T00:00:00+00:00", "2026-11-01T01:30:00+00:00", 5400, 10800),
    ]
    october = list(csv.reader(io.StringIO(ledger_db.cli("invoice", "--account", "acme", "--period", "2026-10", "-o", "-").stdout)))
    november = list(csv.reader(io.StringIO(ledger_db.cli("invoice", "--account", "acme", "--period", "2026-11", "-o", "-").stdout)))
    assert october[1][:12] == ["job", "", "77", "job", "rtx4090", "2", "2026-10-31T23:00:00Z", "2026-11-01T00:00:00Z", "3600", "7200", "0.00012", "0.86"]
    assert november[1][6:12] == ["2026-11-01T00:00:00Z", "2026-11-01T01:30:00Z", "5400", "10800", "0.00012", "1.30"]
    assert october[-1][11] == "0.86" and november[-1][11] == "1.30"


def test_invoice_csv_lines_adjustments_and_exact_total(ledger_db: LedgerDb, tmp_path: Path) -> None:
    ledger_db.add_account("acme")
    tres = "cpu=1,gres/gpu:rtx4090=1,gres/gpu=1"
    replay_ok(
        ledger_db,
        dump(
            tmp_path,
            "n.psv",
            # 0.00012 x 41 = 0.00492 -> 0.00; 0.00012 x 42 = 0.00504 -> 0.01: each line rounds once.
            row(5, "acme", "COMPLETED", "2026-11-02T10:00:00", "2026-11-02T10:00:41", 41, tres, 'say "hi", then|pipe'),
            row(6, "acme", "COMPLETED", "2026-11-02T10:00:00", "2026-11-02T10:00:42", 42, tres, "line\nbreak"),
            row(7, "acme", "COMPLETED", "2026-11-02T09:00:00", "2026-11-02T10:00:00", 3600, "gres/gpu:rtx3090=4,gres/gpu=4"),
            row(8, "other", "COMPLETED", "2026-11-02T09:00:00", "2026-11-02T10:00:00", 3600, tres),
        ),
    )
    adjusted = ledger_db.cli("adjust", "--account", "acme", "--amount", "-1.005", "--reason", "outage, sorry", "--period", "2026-11")
    assert adjusted.returncode == 0, adjusted.stderr
    out = tmp_path / "acme.csv"
    assert ledger_db.cli("invoice", "--account", "acme", "--period", "2026-11", "-o", str(out)).returncode == 0
    raw = out.read_bytes()
    # header, 3 jobs, 1 adjustment, total; the newline inside a quoted name stays a bare LF
    assert raw.count(b"\r\n") == 6 and b"\"line\nbreak\"" in raw
    lines = list(csv.reader(io.StringIO(raw.decode(), newline="")))
    assert lines[0] == [
        "line_type", "gpupool_job_id", "slurm_job_id", "job_name", "gpu_type", "gpus", "start", "end",
        "billed_seconds", "gpu_seconds", "unit_price", "amount", "currency", "tier", "end_reason", "gib_hours",
    ]
    assert [line[2:4] + line[9:12] for line in lines[1:4]] == [
        ["5", 'say "hi", then|pipe', "41", "0.00012", "0.00"],
        ["6", "line\nbreak", "42", "0.00012", "0.01"],
        ["7", "job", "14400", "0.00007", "1.01"],
    ]
    assert [line[13] for line in lines[1:4]] == ["normal"] * 3
    assert lines[4][0] == "adjustment" and lines[4][3] == "outage, sorry" and lines[4][11] == "-1.01" and lines[4][13] == ""
    total = lines[5]
    assert total[0] == "total" and total[8:10] == ["3683", "14483"] and total[13] == ""
    assert total[11] == "0.01"  # 1.01 + 0.00 + 0.01 - 1.01, exactly the lines' sum
    again = tmp_path / "again.csv"
    assert ledger_db.cli("invoice", "--account", "acme", "--period", "2026-11", "-o", str(again)).returncode == 0
    assert again.read_bytes() == raw  # deterministic


def add_api_job(ledger: LedgerDb, job_id: str, slurm_job_id: int, created: str, end_reason: str | None, ended: str | None) -> None:
    """A job row as the API keeps it: the pass finds its id by Slurm id; gpupool's end_reason and Slurm's end."""
    def moment(text: str) -> dt.datetime:
        return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)

    with ledger.sessions() as session, session.begin():
        session.add(
            Job(
                id=job_id, account="acme", owner="alice", name="job", template="jupyter", params={}, gpus=1, cpus=1,
                mem_gb=1, time_limit_min=600, job_dir="/nonexistent", slurm_job_id=slurm_job_id, state="CANCELLED",
                finished=True, end_reason=end_reason, ended_at=None if ended is None else moment(ended),
                request_hash="0" * 64, created_at=moment(created), updated_at=moment(created),
            )
        )


def test_the_line_of_the_run_gpupool_ended_carries_its_end_reason(ledger_db: LedgerDb, tmp_path: Path) -> None:
    ledger_db.add_account("acme")
    tres = "cpu=1,gres/gpu:rtx4090=1,gres/gpu=1"
    idle_gpus = "idle: every GPU under 5% for 60 min, still idle 30 min after the job.idle notice; gpupool cancelled it (account acme idle policy)"
    idle_session = "idle: no request, no open WebSocket and no GPU at 5% or more for 30 min; gpupool cancelled it"
    # 31: preempted and requeued, then cancelled for idle GPUs; 32: a session stopped after midnight of Oct 31; 33: completed.
    add_api_job(ledger_db, "00000000-0000-4000-8000-000000000031", 31, "2026-11-02T09:00:00", idle_gpus, "2026-11-02T12:00:00")
    add_api_job(ledger_db, "00000000-0000-4000-8000-000000000032", 32, "2026-10-31T22:00:00", idle_session, "2026-11-01T01:00:00")
    add_api_job(ledger_db, "00000000-0000-4000-8000-000000000033", 33, "2026-11-02T09:00:00", None, "2026-11-02T10:00:00")
    replay_ok(
        ledger_db,
        dump(
            tmp_path,
            "ended.psv",
            row(31, "acme", "PREEMPTED", "2026-11-02T10:00:00", "2026-11-02T10:30:00", 1800, tres),
            row(31, "acme", "CANCELLED", "2026-11-02T11:00:00", "2026-11-02T12:00:00", 3600, tres),
            row(32, "acme", "CANCELLED", "2026-10-31T23:00:00", "2026-11-01T01:00:00", 7200, tres),
            row(33, "acme", "COMPLETED", "2026-11-02T09:30:00", "2026-11-02T10:00:00", 1800, tres),
        ),
    )

    def invoice(period: str) -> list[dict[str, str]]:
        result = ledger_db.cli("invoice", "--account", "acme", "--period", period, "-o", "-")
        assert result.returncode == 0, result.stderr
        return list(csv.DictReader(io.StringIO(result.stdout)))

    november = [(line["slurm_job_id"], line["end"], line["end_reason"]) for line in invoice("2026-11")]
    assert november == [
        ("31", "2026-11-02T10:30:00Z", ""),  # the preempted run: not the one gpupool ended
        ("31", "2026-11-02T12:00:00Z", idle_gpus),
        ("32", "2026-11-01T01:00:00Z", idle_session),
        ("33", "2026-11-02T10:00:00Z", ""),
        ("", "", ""),  # the total
    ]
    # October's part of the session's run ended at midnight, not when gpupool stopped it: that invoice stays as it was.
    assert [(line["slurm_job_id"], line["end_reason"]) for line in invoice("2026-10")] == [("32", ""), ("", "")]


def test_kill_9_mid_pass_leaves_nothing_and_the_rerun_matches_an_uninterrupted_pass(
    pg_ledger: LedgerDb, tmp_path: Path
) -> None:
    path = tmp_path / "big.psv"
    path.write_text(sacct_dump(list(synthetic_jobs(150_000, seed=11))))
    before = pg_ledger.ledger()
    victim = pg_ledger.start("billing", "replay", str(path))

    def in_transaction() -> bool:
        with pg_ledger.engine.connect() as connection:
            return bool(
                connection.execute(
                    text(
                        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND xact_start IS NOT NULL AND (query LIKE '%billing_state%' OR query LIKE '%ledger_entries%')"
                    )
                ).first()
            )

    wait_for(in_transaction, timeout_s=60, interval_s=0.05, what="the pass to take the billing lock")
    time.sleep(0.3)
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    assert pg_ledger.ledger() == before

    replay_ok(pg_ledger, path)
    after_rerun = pg_ledger.ledger()
    assert len(after_rerun) > len(before)
    replay_ok(pg_ledger, path)
    assert pg_ledger.ledger() == after_rerun
    pg_ledger.assert_spend_exact()  # the killed pass's trigger work went with its rows
    # An uninterrupted pass over the same output, into a ledger of its own, bills the same rows.
    jobs = {r[3] for r in after_rerun if r[1] == "gpupool"}
    assert len(jobs) == sum(1 for job in synthetic_jobs(150_000, seed=11) if job.start is not None)


def test_two_passes_at_once_bill_once(ledger_db: LedgerDb, tmp_path: Path) -> None:
    path = tmp_path / "jobs.psv"
    path.write_text(sacct_dump(list(synthetic_jobs(5_000, seed=3))))
    passes = [ledger_db.start("billing", "replay", str(path)) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in passes]
    assert [p.returncode for p in passes] == [0, 0], outputs
    written = sorted(int(out.split(" ledger rows")[0].rsplit(" ", 1)[1]) for out, _ in outputs)
    assert written[0] == 0 and written[1] > 0
    assert len(pg_rows := ledger_db.ledger()) == written[1]
    assert len(set(pg_rows)) == len(pg_rows)
    ledger_db.assert_spend_exact()


def test_failed_node_runs_are_credited_once(ledger_db: LedgerDb, tmp_path: Path) -> None:
    ledger_db.add_account("acme")
    tres = "cpu=1,gres/gpu:rtx4090=2,gres/gpu=2"
    path = dump(tmp_path, "f.psv", row(9, "acme", "NODE_FAIL", "2026-11-03T00:00:00", "2026-11-03T01:00:00", 3600, tres))
    replay_ok(ledger_db, path)
    replay_ok(ledger_db, path)
    with ledger_db.sessions() as session:
        credits = session.execute(select(Adjustment.account, Adjustment.period, Adjustment.amount_nanos, Adjustment.kind)).all()
    assert credits == [("acme", "2026-11", -2 * 3600 * RTX4090_NANOS, "failed_node_credit")]
    lines = list(csv.reader(io.StringIO(ledger_db.cli("invoice", "--account", "acme", "--period", "2026-11", "-o", "-").stdout)))
    assert [line[0] for line in lines[1:]] == ["job", "adjustment", "total"]
    assert lines[1][11] == "0.86" and lines[2][11] == "-0.86" and lines[3][11] == "0.00"
    ledger_db.assert_spend_exact()


def test_price_changes_never_rewrite_billed_history(ledger_db: LedgerDb, tmp_path: Path) -> None:
    tres = "cpu=1,gres/gpu:rtx4090=1,gres/gpu=1"
    replay_ok(ledger_db, dump(tmp_path, "p.psv", row(3, "acme", "COMPLETED", "2026-11-05T00:00:00", "2026-11-05T00:10:00", 600, tres)))
    before = ledger_db.ledger()
    refused = ledger_db.cli("price", "set", "rtx4090", "0.5", "--from", "2026-11-05T00:05:00")
    assert refused.returncode == 1
    assert "already billed" in refused.stderr and "2026-11-05T00:10:00Z" in refused.stderr
    accepted = ledger_db.cli("price", "set", "rtx4090", "0.00015", "--from", "2026-11-05T00:10:00")
    assert accepted.returncode == 0, accepted.stderr
    assert ledger_db.ledger() == before
    listed = ledger_db.cli("price", "list").stdout.splitlines()
    assert "rtx4090\t2026-11-05T00:10:00Z\t0.00015\tnormal" in listed
    # Usage after the change is billed at the new price.
    replay_ok(ledger_db, dump(tmp_path, "q.psv", row(4, "acme", "COMPLETED", "2026-11-06T00:00:00", "2026-11-06T00:00:10", 10, tres)))
    assert ledger_db.ledger()[-1][15:] == (150_000, 1_500_000)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["billing", "replay", "/nonexistent/dump.psv"], "cannot read"),
        (["price", "set", "rtx4090", "1e-4"], "not a decimal number"),
        (["price", "set", "rtx4090", "0.0000000001"], "more than 9 decimal places"),
        (["price", "set", "rtx 4090;", "0.1"], "not a GPU type"),
        (["invoice", "--account", "acme", "--period", "2026-13"], "YYYY-MM"),
        (["adjust", "--account", "nobody", "--amount", "-1", "--reason", "x"], "no account"),
        (["account", "set", "nobody", "--credit", "5"], "no account"),
        (["billing", "run", "--since", "yesterday"], "ISO 8601"),
    ],
)
def test_bad_operator_input_is_refused_with_a_message(ledger_db: LedgerDb, args: list[str], message: str) -> None:
    result = ledger_db.cli(*args)
    assert result.returncode != 0
    assert message in result.stderr
    assert ledger_db.ledger() == []


def test_garbage_or_unpriced_input_writes_nothing(ledger_db: LedgerDb, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("this is not sacct output\n")
    result = ledger_db.cli("billing", "replay", str(garbage))
    assert result.returncode == 1 and "delimiter" in result.stderr
    unpriced = dump(
        tmp_path,
        "u.psv",
        row(1, "acme", "COMPLETED", "2026-11-05T00:00:00", "2026-11-05T00:10:00", 600, "gres/gpu:rtx4090=1,gres/gpu=1"),
        row(2, "acme", "COMPLETED", "2026-11-05T00:00:00", "2026-11-05T00:10:00", 600, "gres/gpu:h100=1,gres/gpu=1"),
    )
    result = ledger_db.cli("billing", "replay", str(unpriced))
    assert result.returncode == 1
    assert "no price for GPU type 'h100'" in result.stderr
    assert ledger_db.ledger() == []
    with ledger_db.sessions() as session:
        assert session.scalar(select(func.count()).select_from(BillingPass)) == 0


def test_a_types_own_price_starting_mid_run_replaces_the_default_from_that_moment(ledger_db: LedgerDb, tmp_path: Path) -> None:
    """``*`` at 100 nanos, ``a100`` at 1000 from 12-15: a day at each, whether seen in one pass or pass by pass."""
    ledger_db.add_account("acme")
    for price in (("*", "0.0000001", "2020-01-01T00:00:00"), ("a100", "0.000001", "2026-12-15T00:00:00")):
        result = ledger_db.cli("price", "set", price[0], price[1], "--from", price[2])
        assert result.returncode == 0, result.stderr
    tres = "cpu=1,gres/gpu:a100=1,gres/gpu=1"
    start = "2026-12-14T00:00:00"
    replay_ok(ledger_db, dump(tmp_path, "whole.psv", row(41, "acme", "COMPLETED", start, "2026-12-16T00:00:00", 172_800, tres)))
    for name, state, elapsed in (("a.psv", "RUNNING", 3_600), ("b.psv", "RUNNING", 93_600), ("c.psv", "COMPLETED", 172_800)):
        end = "Unknown" if state == "RUNNING" else "2026-12-16T00:00:00"
        replay_ok(ledger_db, dump(tmp_path, name, row(42, "acme", state, start, end, elapsed, tres)))
    for job in (41, 42):
        rows = [r for r in ledger_db.ledger("acme") if r[3] == job]
        assert sum(r[16] for r in rows) == 86_400 * 100 + 86_400 * 1000 == 95_040_000
        own_price_from = dt.datetime(2026, 12, 15, tzinfo=dt.UTC)
        assert {r[15] for r in rows if r[12] <= own_price_from} == {100}
        assert {r[15] for r in rows if r[11] >= own_price_from} == {1000}
    invoice = list(csv.reader(io.StringIO(ledger_db.cli("invoice", "--account", "acme", "--period", "2026-12", "-o", "-").stdout)))
    day_at_each_price = [
        ["2026-12-14T00:00:00Z", "2026-12-15T00:00:00Z", "86400", "86400", "0.0000001", "0.01"],
        ["2026-12-15T00:00:00Z", "2026-12-16T00:00:00Z", "86400", "86400", "0.000001", "0.09"],
    ]
    assert [line[2:3] + line[6:12] for line in invoice[1:-1]] == [["41", *span] for span in day_at_each_price] + [
        ["42", *span] for span in day_at_each_price
    ]


def test_spot_runs_are_billed_at_the_spot_tier_the_cli_sets(ledger_db: LedgerDb, tmp_path: Path) -> None:
    ledger_db.add_account("acme")
    set_spot = ledger_db.cli("price", "set", "rtx4090", "0.00004", "--tier", "spot", "--from", "2026-01-01")
    assert set_spot.returncode == 0, set_spot.stderr
    assert "rtx4090 (spot): 0.00004" in set_spot.stdout
    assert "rtx4090\t2026-01-01T00:00:00Z\t0.00004\tspot" in ledger_db.cli("price", "list").stdout.splitlines()
    refused = ledger_db.cli("price", "set", "rtx4090", "0.00004", "--tier", "cheap")
    assert refused.returncode == 2 and "invalid choice: 'cheap'" in refused.stderr
    tres = "cpu=1,gres/gpu:rtx4090=2,gres/gpu=2"

    def run(job: int, start: str, end: str, elapsed: int, state: str, qos: str) -> str:
        return "|".join(["gpupool", str(job), str(job), "acme", "alice", state, start, start, end, str(elapsed), tres, qos, "gpu01", "spotjob"])

    # One job preempted and requeued (two runs, same id, spot), one full-price job.
    path = tmp_path / "spot.psv"
    path.write_text(as_pass_output([
        "|".join(PASS_FIELDS),
        run(70, "2026-11-07T10:00:00", "2026-11-07T10:00:40", 40, "PREEMPTED", "spot"),
        run(71, "2026-11-07T10:00:40", "2026-11-07T10:01:00", 20, "COMPLETED", "normal"),
        run(70, "2026-11-07T10:03:00", "2026-11-07T10:03:30", 30, "COMPLETED", "spot"),
    ]))
    replay_ok(ledger_db, path)
    billed = [(row[3], f"{row[4]:%H:%M:%S}", row[14], row[15]) for row in ledger_db.ledger("acme") if row[3] in (70, 71)]
    assert billed == [(70, "10:00:00", 80, 40_000), (70, "10:03:00", 60, 40_000), (71, "10:00:40", 40, RTX4090_NANOS)]
    lines = list(csv.reader(io.StringIO(ledger_db.cli("invoice", "--account", "acme", "--period", "2026-11", "-o", "-").stdout)))
    spot_lines = [(line[2], line[8], line[10], line[13]) for line in lines[1:] if line[0] == "job" and line[2] in ("70", "71")]
    assert spot_lines == [
        ("70", "40", "0.00004", "spot"), ("70", "30", "0.00004", "spot"), ("71", "20", format_nanos(RTX4090_NANOS), "normal"),
    ]


def test_a_line_never_mixes_tiers_even_at_one_price(ledger_db: LedgerDb, tmp_path: Path) -> None:
    """A spot run pays the full price until the spot tier's first price; that price equal to the full one still starts a line."""
    ledger_db.add_account("acme")
    same = format_nanos(RTX4090_NANOS)
    set_spot = ledger_db.cli("price", "set", "rtx4090", same, "--tier", "spot", "--from", "2026-11-07T10:00:30")
    assert set_spot.returncode == 0, set_spot.stderr
    fields = ["gpupool", "80", "80", "acme", "alice", "COMPLETED", "2026-11-07T10:00:00", "2026-11-07T10:00:00",
              "2026-11-07T10:01:00", "60", "cpu=1,gres/gpu:rtx4090=2,gres/gpu=2", "spot", "gpu01", "spotjob"]
    path = tmp_path / "spot.psv"
    path.write_text(as_pass_output(["|".join(PASS_FIELDS), "|".join(fields)]))
    replay_ok(ledger_db, path)
    with ledger_db.engine.connect() as connection:
        tiers = connection.execute(
            select(LedgerEntry.interval_from, LedgerEntry.unit_price_nanos, LedgerEntry.tier).order_by(LedgerEntry.interval_from)
        ).all()
    assert [(f"{start:%H:%M:%S}", price, tier) for start, price, tier in tiers] == [
        ("10:00:00", RTX4090_NANOS, "normal"), ("10:00:30", RTX4090_NANOS, "spot"),
    ]
    invoice = ledger_db.cli("invoice", "--account", "acme", "--period", "2026-11", "-o", "-")
    lines = list(csv.DictReader(io.StringIO(invoice.stdout)))
    assert [(line["start"], line["end"], line["gpu_seconds"], line["unit_price"], line["amount"], line["tier"]) for line in lines] == [
        ("2026-11-07T10:00:00Z", "2026-11-07T10:00:30Z", "60", same, "0.01", "normal"),
        ("2026-11-07T10:00:30Z", "2026-11-07T10:01:00Z", "60", same, "0.01", "spot"),
        ("", "", "120", "", "0.02", ""),  # each line rounded: one mixed line would be 0.0144, so 0.01
    ]
