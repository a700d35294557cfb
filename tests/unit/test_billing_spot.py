"""Spot prices: each run billed at the tier of the QOS sacct says it ran under.

The sacct text is of the shape ``sacct -a -X -D -P -o <PASS_FIELDS>`` printed
for a preemption on the local cluster (tests/live/test_spot_preemption.py):
job 41 of account ``spota`` preempted and requeued (two rows, one per run,
same job id, each with its own start), job 42 of ``spotb`` at full price.
"""

from __future__ import annotations

import datetime as dt

import pytest

from bench.support.metering import meter, parse_runs
from billing.meter import Billed, LedgerRow, RunKey
from billing.price_book import NORMAL_TIER, SPOT_TIER, PriceBook
from billing.sacct import PASS_FIELDS, SACCT_FIELDS
from gpupool.errors import PriceMissing


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


FULL, SPOT = 120_000, 40_000  # nano-units per GPU-second
PRICES = PriceBook([
    ("rtx4090", utc("2026-01-01T00:00:00"), FULL),
    ("rtx4090", utc("2026-01-01T00:00:00"), SPOT, SPOT_TIER),
])
DELIMITER = "\x1f7Qv"
TRES4 = "billing=4,cpu=4,gres/gpu:rtx4090=4,gres/gpu=4,mem=16G,node=1"
RECORDED = [
    "gpupool|41|41|spota|gp-spota|PREEMPTED|2026-12-02T05:00:00|2026-12-02T05:00:01|2026-12-02T05:00:19|18|" + TRES4 + "|spot|vm|spot-a",
    "gpupool|42|42|spotb|gp-spotb|COMPLETED|2026-12-02T05:00:14|2026-12-02T05:00:50|2026-12-02T05:01:05|15|" + TRES4 + "|normal|vm|full-b",
    "gpupool|41|41|spota|gp-spota|COMPLETED|2026-12-02T05:00:19|2026-12-02T05:01:17|2026-12-02T05:01:29|12|" + TRES4 + "|spot|vm|spot-a",
]


def output(rows: list[str], fields: tuple[str, ...] = PASS_FIELDS) -> str:
    return "\n".join(line.replace("|", DELIMITER) for line in ["|".join(fields), *rows]) + "\n"


def bill(text: str, prices: PriceBook = PRICES, billed: dict[RunKey, Billed] | None = None) -> list[LedgerRow]:
    return meter(parse_runs(text, delimiter=DELIMITER).runs, {} if billed is None else billed, prices)


def summary(rows: list[LedgerRow]) -> list[tuple[int, str, str, int, int, str]]:
    return [
        (r.run.job_id_raw, f"{r.run.start:%H:%M:%S}", f"{r.interval_to:%H:%M:%S}", r.gpu_seconds, r.amount_nanos, r.tier)
        for r in rows
    ]


def test_each_run_of_a_preempted_job_is_billed_at_the_spot_price_and_the_preemptor_at_full() -> None:
    rows = bill(output(RECORDED))
    assert summary(rows) == [
        (41, "05:00:01", "05:00:19", 4 * 18, 4 * 18 * SPOT, SPOT_TIER),
        (42, "05:00:50", "05:01:05", 4 * 15, 4 * 15 * FULL, NORMAL_TIER),
        (41, "05:01:17", "05:01:29", 4 * 12, 4 * 12 * SPOT, SPOT_TIER),
    ]
    assert [r.unit_price_nanos for r in rows] == [SPOT, FULL, SPOT]
    assert all(r.final for r in rows)


def test_a_second_pass_over_the_same_runs_bills_nothing() -> None:
    billed: dict[RunKey, Billed] = {}
    first = bill(output(RECORDED), billed=billed)
    assert len(first) == 3
    assert bill(output(RECORDED), billed=billed) == []


def test_the_run_pays_the_qos_slurm_ran_it_under_not_what_was_asked() -> None:
    # The same job, moved to (or submitted directly under) QOS normal: sacct says normal.
    moved = [RECORDED[0].replace("|spot|vm|spot-a", "|normal|vm|spot-a")]
    assert summary(bill(output(moved))) == [(41, "05:00:01", "05:00:19", 72, 72 * FULL, NORMAL_TIER)]


def test_a_qos_without_a_price_of_its_own_pays_the_full_price() -> None:
    only_full = PriceBook([("rtx4090", utc("2026-01-01T00:00:00"), FULL)])
    assert [r.amount_nanos for r in bill(output(RECORDED[:1]), only_full)] == [72 * FULL]
    assert [r.tier for r in bill(output(RECORDED[:1]), only_full)] == [NORMAL_TIER]
    other_qos = [RECORDED[0].replace("|spot|vm|spot-a", "|high|vm|spot-a")]
    assert [r.amount_nanos for r in bill(output(other_qos))] == [72 * FULL]


def test_a_spot_price_that_starts_mid_run_splits_the_run_there() -> None:
    prices = PriceBook([
        ("rtx4090", utc("2026-01-01T00:00:00"), FULL),
        ("rtx4090", utc("2026-12-02T05:00:11"), SPOT, SPOT_TIER),
    ])
    rows = bill(output(RECORDED[:1]), prices)
    assert [(r.seconds, r.unit_price_nanos, r.tier) for r in rows] == [(10, FULL, NORMAL_TIER), (8, SPOT, SPOT_TIER)]
    assert sum(r.gpu_seconds for r in rows) == 4 * 18


def test_a_spot_default_price_covers_every_type() -> None:
    prices = PriceBook([("rtx4090", utc("2026-01-01T00:00:00"), FULL), ("*", utc("2026-01-01T00:00:00"), 7, SPOT_TIER)])
    assert [r.unit_price_nanos for r in bill(output(RECORDED[:1]), prices)] == [7]


def test_output_without_a_qos_column_bills_at_the_normal_tier() -> None:
    old = [line.replace("|spot|vm|", "|").replace("|normal|vm|", "|") for line in RECORDED]
    rows = bill(output(old, SACCT_FIELDS))
    assert [r.tier for r in rows] == [NORMAL_TIER] * 3
    assert [r.unit_price_nanos for r in rows] == [FULL] * 3


def test_a_correction_of_a_spot_run_takes_back_at_the_spot_price() -> None:
    billed: dict[RunKey, Billed] = {}
    running = RECORDED[0].replace("PREEMPTED", "RUNNING").replace("|2026-12-02T05:00:19|18|", "|Unknown|25|")
    bill(output([running]), billed=billed)
    rows = bill(output(RECORDED[:1]), billed=billed)
    assert [(r.seconds, r.unit_price_nanos, r.tier, r.correction) for r in rows] == [(-7, SPOT, SPOT_TIER, True)]


def test_worst_case_of_a_spot_job_is_at_the_spot_price() -> None:
    now = utc("2026-12-02T05:00:00")
    assert PRICES.highest("rtx4090", now, SPOT_TIER) == SPOT
    assert PRICES.highest(None, now, SPOT_TIER) == SPOT
    assert PRICES.highest(None, now) == FULL
    # A type the spot tier does not price: its full price is the worst case.
    mixed = PriceBook([*((t, now, p) for t, p in (("rtx4090", FULL), ("rtx3090", 90_000))), ("rtx4090", now, SPOT, SPOT_TIER)])
    assert mixed.highest(None, now, SPOT_TIER) == 90_000
    with pytest.raises(PriceMissing):
        PriceBook([("rtx4090", now, SPOT, SPOT_TIER)]).highest("rtx3090", now, SPOT_TIER)
