"""Ledger arithmetic: metering running jobs, month and price splits, the GPU-second invariant."""

from __future__ import annotations

import datetime as dt

import pytest

from bench.support.metering import meter
from billing.credits import failed_node_credits
from billing.meter import Billed, LedgerRow, RunKey
from billing.price_book import PriceBook
from billing.sacct import JobRun
from gpupool.errors import PriceMissing


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


PRICES = PriceBook([("rtx4090", utc("2026-01-01T00:00:00"), 120_000), ("rtx3090", utc("2026-01-01T00:00:00"), 70_000)])


def run(elapsed_s: int, *, start: str = "2026-11-10T10:00:00", state: str = "COMPLETED", gpus: dict[str, int] | None = None) -> JobRun:
    begin = utc(start)
    return JobRun(
        cluster="c", job_id_raw=7, job_id="7", account="acme", state=state, start=begin,
        end=begin + dt.timedelta(seconds=elapsed_s), elapsed_s=elapsed_s, gpus=gpus or {"rtx4090": 2}, name="n",
    )


def spans(rows: list[LedgerRow]) -> list[tuple[str, str, int, int, int]]:
    return [
        (f"{r.interval_from:%m-%dT%H:%M:%S}", f"{r.interval_to:%m-%dT%H:%M:%S}", r.seconds, r.gpu_seconds, r.amount_nanos)
        for r in rows
    ]


def test_finished_run_is_one_row_worth_gpus_times_elapsed() -> None:
    rows = meter([run(100)], {}, PRICES)
    assert spans(rows) == [("11-10T10:00:00", "11-10T10:01:40", 100, 200, 200 * 120_000)]
    assert rows[0].period == "2026-11"


def test_running_job_is_billed_pass_by_pass_without_gap_or_overlap() -> None:
    billed: dict[RunKey, Billed] = {}
    first = meter([run(300, state="RUNNING")], billed, PRICES)
    assert not first[0].final
    again = meter([run(300, state="RUNNING")], billed, PRICES)  # a rerun of the same pass
    second = meter([run(610, state="RUNNING")], billed, PRICES)
    final = meter([run(645, state="COMPLETED")], billed, PRICES)
    assert again == []
    assert spans(first + second + final) == [
        ("11-10T10:00:00", "11-10T10:05:00", 300, 600, 600 * 120_000),
        ("11-10T10:05:00", "11-10T10:10:10", 310, 620, 620 * 120_000),
        ("11-10T10:10:10", "11-10T10:10:45", 35, 70, 70 * 120_000),
    ]
    assert sum(r.gpu_seconds for r in first + second + final) == 2 * 645
    assert [r.final for r in first + second + final] == [False, False, True]


def test_usage_across_a_month_boundary_is_split_at_midnight_utc() -> None:
    rows = meter([run(7200, start="2026-11-30T23:30:00")], {}, PRICES)
    assert [(r.period, r.seconds) for r in rows] == [("2026-11", 1800), ("2026-12", 5400)]
    assert rows[1].interval_from == utc("2026-12-01T00:00:00")


def test_year_end_split() -> None:
    rows = meter([run(20, start="2026-12-31T23:59:50")], {}, PRICES)
    assert [(r.period, r.seconds) for r in rows] == [("2026-12", 10), ("2027-01", 10)]


def test_price_change_mid_run_splits_the_row_and_keeps_each_price() -> None:
    prices = PriceBook([("rtx4090", utc("2026-01-01T00:00:00"), 100), ("rtx4090", utc("2026-11-10T10:01:00"), 300)])
    rows = meter([run(100)], {}, prices)
    assert [(r.seconds, r.unit_price_nanos, r.amount_nanos) for r in rows] == [(60, 100, 2 * 60 * 100), (40, 300, 2 * 40 * 300)]


def test_every_gpu_type_of_a_mixed_job_is_billed_at_its_own_price() -> None:
    rows = meter([run(10, gpus={"rtx4090": 1, "rtx3090": 2})], {}, PRICES)
    assert sorted((r.gpu_type, r.gpu_seconds, r.amount_nanos) for r in rows) == [
        ("rtx3090", 20, 20 * 70_000),
        ("rtx4090", 10, 10 * 120_000),
    ]


def test_default_price_covers_types_without_their_own() -> None:
    prices = PriceBook([("*", utc("2026-01-01T00:00:00"), 5)])
    (row,) = meter([run(10, gpus={"untyped": 1})], {}, prices)
    assert row.amount_nanos == 50


def test_usage_before_any_price_is_refused_not_billed_at_zero() -> None:
    prices = PriceBook([("rtx4090", utc("2026-12-01T00:00:00"), 5)])
    with pytest.raises(PriceMissing, match="rtx4090"):
        meter([run(10)], {}, prices)


def test_requeued_runs_are_separate_keys() -> None:
    first = run(26, state="REQUEUED")
    second = run(40, start="2026-11-10T10:03:00")
    billed: dict[RunKey, Billed] = {}
    rows = meter([first, second], billed, PRICES)
    assert [r.run.start for r in rows] == [first.start, second.start]
    assert sorted(b.seconds for b in billed.values()) == [26, 40]


@pytest.mark.parametrize("elapsed", [1, 59, 3600, 86_400 * 40 + 7])
def test_invariant_sum_of_gpu_seconds_is_gpus_times_elapsed(elapsed: int) -> None:
    billed: dict[RunKey, Billed] = {}
    rows: list[LedgerRow] = []
    for seen in sorted({elapsed // 3, elapsed // 2, elapsed}):
        rows += meter([run(seen, start="2026-10-20T12:00:00", state="RUNNING" if seen < elapsed else "COMPLETED")], billed, PRICES)
    assert sum(r.gpu_seconds for r in rows) == 2 * elapsed
    assert all(r.interval_to == n.interval_from for r, n in zip(rows, rows[1:], strict=False))


def test_failed_node_credit_returns_each_period_charge() -> None:
    failed = run(100, state="NODE_FAIL")
    key = ("c", 7, failed.start, "rtx4090")
    credits = failed_node_credits([failed, run(5)], {(key, "2026-11"): 900, (key, "2026-12"): 100})
    assert [(period, credit) for _, period, credit in credits] == [("2026-11", -900), ("2026-12", -100)]


def test_seconds_billed_past_the_real_end_are_taken_back_by_correction_rows() -> None:
    """sacct said RUNNING with 'now - start' while slurmdbd had not heard of the end yet."""
    billed: dict[RunKey, Billed] = {}
    stale = meter([run(610, state="RUNNING")], billed, PRICES)
    stale_again = meter([run(610, state="RUNNING")], billed, PRICES)
    final = meter([run(605)], billed, PRICES)
    assert stale_again == []
    assert [(r.seconds, r.gpu_seconds, r.correction) for r in final] == [(-5, -10, True)]
    assert (final[0].interval_from, final[0].interval_to) == (utc("2026-11-10T10:10:05"), utc("2026-11-10T10:10:10"))
    assert sum(r.gpu_seconds for r in stale + final) == 2 * 605
    assert sum(r.amount_nanos for r in stale + final) == 2 * 605 * 120_000
    assert meter([run(605)], billed, PRICES) == []
    # The stale snapshot, replayed from an old archive after the end is known, bills nothing.
    assert meter([run(610, state="RUNNING")], billed, PRICES) == []


def test_a_finished_record_that_adds_nothing_still_closes_the_run() -> None:
    billed: dict[RunKey, Billed] = {}
    meter([run(300, state="RUNNING")], billed, PRICES)
    (marker,) = meter([run(300)], billed, PRICES)
    assert (marker.seconds, marker.amount_nanos, marker.final, marker.interval_from) == (0, 0, True, utc("2026-11-10T10:05:00"))
    assert billed[("c", 7, utc("2026-11-10T10:00:00"), "rtx4090")] == Billed(300, True)


def test_a_correction_across_a_month_start_and_a_price_change_is_cut_like_the_rows_it_reverses() -> None:
    prices = PriceBook([("rtx4090", utc("2026-01-01T00:00:00"), 100), ("rtx4090", utc("2026-12-01T00:00:30"), 300)])
    billed: dict[RunKey, Billed] = {}
    start = "2026-11-30T23:59:00"
    billed_rows = meter([run(120, start=start, state="RUNNING")], billed, prices)
    corrections = meter([run(50, start=start)], billed, prices)
    assert [(r.period, r.seconds, r.unit_price_nanos) for r in billed_rows] == [("2026-11", 60, 100), ("2026-12", 30, 100), ("2026-12", 30, 300)]
    assert [(r.period, r.seconds, r.unit_price_nanos) for r in corrections] == [("2026-11", -10, 100), ("2026-12", -30, 100), ("2026-12", -30, 300)]
    assert sum(r.amount_nanos for r in billed_rows + corrections) == 2 * 50 * 100


def test_a_run_that_ends_with_no_elapsed_time_bills_nothing() -> None:
    assert meter([run(0, state="CANCELLED")], {}, PRICES) == []


# A run from 12-14 to 12-16 on one rtx4090: a day at the default price, then a day at the type's own.
TYPE_PRICE_LATER = PriceBook([("*", utc("2026-01-01T00:00:00"), 100), ("rtx4090", utc("2026-12-15T00:00:00"), 1000)])
DAY_AT_DEFAULT_THEN_DAY_AT_OWN_PRICE = 86_400 * 100 + 86_400 * 1000  # 95,040,000 nanos


def test_a_types_own_price_starting_mid_run_replaces_the_default_in_one_pass() -> None:
    rows = meter([run(2 * 86_400, start="2026-12-14T00:00:00", gpus={"rtx4090": 1})], {}, TYPE_PRICE_LATER)
    assert spans(rows) == [
        ("12-14T00:00:00", "12-15T00:00:00", 86_400, 86_400, 86_400 * 100),
        ("12-15T00:00:00", "12-16T00:00:00", 86_400, 86_400, 86_400 * 1000),
    ]
    assert sum(r.amount_nanos for r in rows) == DAY_AT_DEFAULT_THEN_DAY_AT_OWN_PRICE


def test_a_types_own_price_starting_mid_run_replaces_the_default_pass_by_pass() -> None:
    billed: dict[RunKey, Billed] = {}
    rows: list[LedgerRow] = []
    for seen, state in ((3_600, "RUNNING"), (86_400 + 7_200, "RUNNING"), (2 * 86_400 + 60, "RUNNING"), (2 * 86_400, "COMPLETED")):
        rows += meter([run(seen, start="2026-12-14T00:00:00", state=state, gpus={"rtx4090": 1})], billed, TYPE_PRICE_LATER)
    assert sum(r.gpu_seconds for r in rows) == 2 * 86_400
    assert sum(r.amount_nanos for r in rows) == DAY_AT_DEFAULT_THEN_DAY_AT_OWN_PRICE
    # The seconds billed past the end are taken back at the price they were billed at.
    assert [(r.seconds, r.unit_price_nanos) for r in rows if r.correction] == [(-60, 1000)]


def test_a_default_price_change_still_cuts_a_type_that_has_no_price_of_its_own_yet() -> None:
    prices = PriceBook([
        ("*", utc("2026-01-01T00:00:00"), 100),
        ("*", utc("2026-12-14T12:00:00"), 200),
        ("rtx4090", utc("2026-12-15T00:00:00"), 1000),
    ])
    rows = meter([run(2 * 86_400, start="2026-12-14T00:00:00", gpus={"rtx4090": 1})], {}, prices)
    assert [(r.seconds, r.unit_price_nanos) for r in rows] == [(43_200, 100), (43_200, 200), (86_400, 1000)]
