"""The operator report's arithmetic and parsers, on literal Slurm output (no database, no cluster)."""

from __future__ import annotations

import datetime as dt

import pytest

from billing.report import (
    AVERAGE_MONTH_S,
    NodePayback,
    attribute_to_nodes,
    cents_text,
    energy_nanos,
    gpu_hours,
    months_to_payback,
    parse_window,
    payback_figures,
    percentile,
    queue_waits,
    sum_ledger_rows,
    union_s,
    utilization_cells,
)
from gpupool.errors import BadRequest
from gpupool.slurm.parse import ParseError
from gpupool.slurm.report import (
    parse_allocations,
    parse_node_events,
    parse_node_gpus,
    parse_pending,
    parse_sreport_utilization,
)

NANOS = 10**9


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


# Two 4-GPU nodes; a sits in two partitions, so sinfo --Node lists it twice.
SINFO = """NODELIST|GRES|STATE
a|gpu:rtx4090:4(S:0-1)|mixed
a|gpu:rtx4090:4(S:0-1)|mixed
b|gpu:rtx3090:4|drained
c|(null)|idle
"""
# sacct --allusers -X -D -P --format=JobIDRaw,JobID,Account,User,State,Submit,Start,End,AllocTRES,NodeList
SACCT = """JobIDRaw|JobID|Account|User|State|Submit|Start|End|AllocTRES|NodeList
10|10|acme|gp-acme|COMPLETED|2026-11-02T09:50:00|2026-11-02T10:00:00|2026-11-02T10:30:00|billing=2,cpu=2,gres/gpu:rtx4090=2,gres/gpu=2,mem=8G,node=1|a
11|11|acme|gp-acme|COMPLETED|2026-11-02T10:10:00|2026-11-02T10:15:00|2026-11-02T10:45:00|cpu=1,gres/gpu=1,mem=4G,node=1|b
12|12_3|beta|gp-beta|RUNNING|2026-11-02T11:00:00|2026-11-02T11:00:00|Unknown|cpu=8,gres/gpu:rtx4090=4,gres/gpu=4,mem=32G,node=1|a
13|13|beta|gp-beta|CANCELLED by 0|2026-11-02T10:00:00|None|2026-11-02T10:05:00||None assigned
14|14|acme|gp-acme|COMPLETED|2026-11-02T09:00:00|2026-11-02T09:10:00|2026-11-02T09:20:00|cpu=1,gres/gpu:rtx4090=1,gres/gpu=1|a
15|15|beta|gp-beta|COMPLETED|2026-11-02T10:00:00|2026-11-02T10:02:00|2026-11-02T10:04:00|cpu=4,mem=4G,node=1|c
"""
# sacctmgr -P show event start=... end=... format=Cluster,NodeName,TimeStart,TimeEnd,State,Event
EVENTS = """Cluster|NodeName|TimeStart|TimeEnd|State|Event
gpupool||2026-01-01T00:00:00|Unknown||Cluster
gpupool|b|2026-11-02T10:30:00|2026-11-02T11:00:00|DRAIN|Node
gpupool|b|2026-11-02T10:50:00|2026-11-02T11:10:00|DOWN*|Node
"""
SINCE, END = utc("2026-11-02T10:00:00"), utc("2026-11-02T12:00:00")


def test_sinfo_lists_each_node_once_with_its_gpus_by_type() -> None:
    nodes = parse_node_gpus(SINFO)
    assert [(n.name, n.gpus, n.state) for n in nodes] == [
        ("a", {"rtx4090": 4}, "mixed"),
        ("b", {"rtx3090": 4}, "drained"),
        ("c", {}, "idle"),
    ]


def test_sacct_allocations_keep_runs_and_never_started_jobs_apart() -> None:
    runs = {run.job_id: run for run in parse_allocations(SACCT)}
    assert runs["12_3"].job_id_raw == 12 and runs["12_3"].ended_at is None and runs["12_3"].gpus == {"rtx4090": 4}
    assert runs["13"].started_at is None and runs["13"].nodes == () and runs["13"].state == "CANCELLED"
    assert runs["11"].gpus == {"untyped": 1}
    many = parse_allocations(
        "JobIDRaw|JobID|Account|User|State|Submit|Start|End|AllocTRES|NodeList\n"
        "7|7|x|u|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:00|2026-11-01T00:01:00|gres/gpu=4|gpu[01-02]\n"
    )
    assert many[0].nodes == ("gpu01", "gpu02")


def test_union_counts_overlapping_events_once() -> None:
    spans = [(utc("2026-11-02T10:30:00"), utc("2026-11-02T11:00:00")), (utc("2026-11-02T10:50:00"), utc("2026-11-02T11:10:00"))]
    assert union_s(spans, SINCE, END) == 40 * 60
    assert union_s(spans, utc("2026-11-02T11:05:00"), END) == 5 * 60


def test_utilization_with_a_drain_interval() -> None:
    """Node b drained 10:30-11:00 then down until 11:10 (40 min out); its 1-GPU job ran 10:15-10:45."""
    cells = utilization_cells(parse_node_gpus(SINFO), parse_allocations(SACCT), parse_node_events(EVENTS), SINCE, END)
    a, b = cells[("a", "rtx4090")], cells[("b", "rtx3090")]
    # a: job 10, 2 GPUs x 30 min; job 12, 4 GPUs from 11:00, still running at the window's end (1 h).
    assert (a.possible, a.unavailable, a.allocated) == (4 * 7200, 0, 2 * 1800 + 4 * 3600)
    # b: the untyped GPU takes b's only type; 4 GPUs x 40 min out.
    assert (b.possible, b.unavailable, b.allocated) == (4 * 7200, 4 * 2400, 1 * 1800)
    assert b.available == 4 * 7200 - 4 * 2400
    assert ("c", "untyped") not in cells  # a GPU-less job on a GPU-less node is nobody's GPU time


def test_allocated_time_on_a_drained_node_counts_as_allocated_not_down() -> None:
    """As slurmdbd's roll-up: a node drained while its job runs on is busy, not down."""
    events = parse_node_events(
        "Cluster|NodeName|TimeStart|TimeEnd|State|Event\ngpupool|a|2026-11-02T10:00:00|Unknown|DRAIN|Node\n"
    )
    cells = utilization_cells(parse_node_gpus(SINFO), parse_allocations(SACCT), events, SINCE, END)
    a = cells[("a", "rtx4090")]
    assert a.allocated == 2 * 1800 + 4 * 3600 and a.unavailable == a.possible - a.allocated


def test_the_cluster_counts_from_its_registration_with_slurmdbd() -> None:
    events = parse_node_events("Cluster|NodeName|TimeStart|TimeEnd|State|Event\ngpupool||2026-11-02T11:30:00|Unknown||Cluster\n")
    cells = utilization_cells(parse_node_gpus(SINFO), [], events, SINCE, END)
    assert cells[("a", "rtx4090")].possible == 4 * 1800


def test_queue_wait_percentiles_by_type_and_account() -> None:
    nodes = {node.name: node.gpus for node in parse_node_gpus(SINFO)}
    waits = queue_waits(parse_allocations(SACCT), nodes, SINCE, END)
    # Started in the window with GPUs: 10 (600 s), 11 (300 s), 12 (0 s); 14 started before, 13 never, 15 had no GPU.
    assert waits["all"] == {"jobs": 3, "p50_s": 300, "p95_s": 600, "max_s": 600}
    assert waits["by_gpu_type"] == [
        {"gpu_type": "rtx3090", "jobs": 1, "p50_s": 300, "p95_s": 300, "max_s": 300},
        {"gpu_type": "rtx4090", "jobs": 2, "p50_s": 0, "p95_s": 600, "max_s": 600},
    ]
    assert [line["account"] for line in waits["by_account"]] == ["acme", "beta"]


@pytest.mark.parametrize(
    ("values", "p50", "p95"),
    [([], None, None), ([7], 7, 7), ([1, 2, 3, 4], 2, 4), (list(range(1, 101)), 50, 95), (list(range(1, 21)), 10, 19)],
)
def test_percentile_is_nearest_rank(values: list[int], p50: int | None, p95: int | None) -> None:
    assert (percentile(values, 50), percentile(values, 95)) == (p50, p95)


def test_ledger_rows_are_prorated_to_the_window_and_split_by_day() -> None:
    price = 120_000  # 0.00012 per GPU-second
    rows = [
        # inside: 2 GPUs x 100 s
        ("acme", "rtx4090", 2, utc("2026-11-02T10:00:00"), utc("2026-11-02T10:01:40"), 100, 200, price, 200 * price, 1, utc("2026-11-02T10:00:00")),
        # across the window's end (12:00): 1 GPU, 600 s of which 300 inside
        ("beta", "rtx4090", 1, utc("2026-11-02T11:55:00"), utc("2026-11-02T12:05:00"), 600, 600, price, 600 * price, 2, utc("2026-11-02T11:55:00")),
        # a correction taking back 10 s of 2 GPUs
        ("acme", "rtx4090", 2, utc("2026-11-02T10:01:30"), utc("2026-11-02T10:01:40"), -10, -20, price, -20 * price, 1, utc("2026-11-02T10:00:00")),
    ]
    sums = sum_ledger_rows(rows, SINCE, END)
    assert sums.total.gpu_seconds == 200 + 300 - 20
    assert sums.total.nanos == (200 + 300 - 20) * price
    assert sums.by_run[(1, utc("2026-11-02T10:00:00"))] == 180 * price
    assert {account: s.gpu_seconds for account, s in sums.by_account.items()} == {"acme": 180, "beta": 300}
    midnight = sum_ledger_rows(
        [("acme", "rtx4090", 1, utc("2026-11-02T23:59:00"), utc("2026-11-03T00:01:00"), 120, 120, price, 120 * price, 3, utc("2026-11-02T23:59:00"))],
        utc("2026-11-01T00:00:00"),
        utc("2026-12-01T00:00:00"),
    )
    assert {day.isoformat(): s.gpu_seconds for day, s in midnight.by_day.items()} == {"2026-11-02": 60, "2026-11-03": 60}


def test_revenue_is_summed_by_the_tier_each_row_was_priced_at() -> None:
    full, spot = 120_000, 40_000
    rows = [
        ("acme", "rtx4090", 4, utc("2026-11-02T10:00:00"), utc("2026-11-02T10:00:18"), 18, 72, spot, 72 * spot, 41, utc("2026-11-02T10:00:00"), "spot"),
        ("beta", "rtx4090", 4, utc("2026-11-02T10:00:20"), utc("2026-11-02T10:00:35"), 15, 60, full, 60 * full, 42, utc("2026-11-02T10:00:20"), "normal"),
        ("acme", "rtx4090", 4, utc("2026-11-02T10:00:40"), utc("2026-11-02T10:00:52"), 12, 48, spot, 48 * spot, 41, utc("2026-11-02T10:00:40"), "spot"),
        # a row written before tiers: normal's
        ("beta", "rtx4090", 1, utc("2026-11-02T11:00:00"), utc("2026-11-02T11:00:10"), 10, 10, full, 10 * full, 7, utc("2026-11-02T11:00:00")),
    ]
    sums = sum_ledger_rows(rows, SINCE, END)
    assert {tier: (s.gpu_seconds, s.nanos) for tier, s in sums.by_tier.items()} == {
        "spot": (120, 120 * spot),
        "normal": (70, 70 * full),
    }
    assert sums.total.nanos == sum(s.nanos for s in sums.by_tier.values())


def test_display_rounds_once_to_the_cent_half_away_from_zero() -> None:
    assert cents_text("0.005") == "0.01" and cents_text("-0.005") == "-0.01" and cents_text("0.0049999") == "0.00"
    assert cents_text("0.03372") == "0.03"
    assert gpu_hours(281) == "0.08" and gpu_hours(18) == "0.01" and gpu_hours(17) == "0.00" and gpu_hours(-18) == "-0.01"


def test_energy_and_months_to_payback() -> None:
    # 1800 W for one hour at 0.15 a kWh: 1.8 kWh, 0.27.
    assert energy_nanos(1800, 3600, 150_000_000) == 270_000_000
    assert months_to_payback(0, 0) == "0.0" and months_to_payback(-5, 0) == "0.0"
    assert months_to_payback(100 * NANOS, 0) is None and months_to_payback(100 * NANOS, -1) is None
    assert months_to_payback(100 * NANOS, 30 * NANOS) == "3.3"


def test_payback_worked_example_from_the_source_articles() -> None:
    """README's example: a 4x RTX 4090 box at 40,000, 2330 W, 1.00 a kWh, 0.001 per GPU-second, half busy."""
    box = NodePayback("gpu01", 40_000 * NANOS, utc("2026-01-01T00:00:00"), 2330)
    half_busy = 4 * NANOS // 2 // 1000  # nano-units per second: 4 GPUs, 50 %, 0.001 per GPU-second
    to_date = {"gpu01": half_busy * 90 * 86400}  # January to March
    march = {"gpu01": half_busy * 31 * 86400}
    payback = payback_figures([box], to_date, march, NANOS, utc("2026-03-01T00:00:00"), utc("2026-04-01T00:00:00"))
    node = payback["nodes"][0]
    assert node["revenue_to_date"] == "15552.00" and node["revenue"] == "5356.80"
    assert node["electricity"] == "1733.52"  # 2.33 kW x 744 h
    assert node["electricity_to_date"] == "5032.80" and node["cost_to_date"] == "45032.80"
    assert node["margin"] == "3623.28" and node["margin_to_date"] == "-29480.80"
    assert node["monthly_margin"] == "3557.46195"  # March's margin per average month: x 2629746 / 2678400
    assert node["months_to_payback"] == "8.3" and node["paid_back"] is False
    assert payback["total"]["months_to_payback"] == "8.3"
    assert AVERAGE_MONTH_S == 2_629_746


def test_revenue_follows_each_run_to_its_nodes() -> None:
    allocations = parse_allocations(
        "JobIDRaw|JobID|Account|User|State|Submit|Start|End|AllocTRES|NodeList\n"
        "7|7|x|u|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:00|2026-11-01T00:01:00|gres/gpu:rtx4090=3,gres/gpu=3|a,b\n"
    )
    by_node, unattributed = attribute_to_nodes(
        {(7, utc("2026-11-01T00:00:00")): 100, (8, utc("2026-11-01T00:00:00")): 5}, allocations, {}
    )
    assert by_node == {"a": 66, "b": 34} and unattributed == 5  # a has 2 of the 3 GPUs


def test_window_is_a_month_or_a_range() -> None:
    now = utc("2026-11-30T16:00:00")
    assert parse_window(now=now) == (utc("2026-11-01T00:00:00"), utc("2026-12-01T00:00:00"))
    assert parse_window("2026-12", now=now) == (utc("2026-12-01T00:00:00"), utc("2027-01-01T00:00:00"))
    assert parse_window(since="2026-11-29", now=now) == (utc("2026-11-29T00:00:00"), now)
    assert parse_window(since="2026-11-29T08:00:00+08:00", until="2026-11-30T00:00Z", now=now) == (utc("2026-11-29T00:00:00"), utc("2026-11-30T00:00:00"))
    for period, since, until in (("2026-13", None, None), ("2026-11", "2026-11-01", None), (None, None, "2026-11-02"),
                                 (None, "2026-11-02", "2026-11-01"), (None, "2025-01-01", "2026-11-01"), (None, "yesterday", None)):
        with pytest.raises(BadRequest):
            parse_window(period, since, until, now=now)


def test_pending_jobs_with_their_reason_and_gpus() -> None:
    # squeue --states=PENDING --Format=JobID:|,Account:|,UserName:|,SubmitTime:|,Reason:|,NumNodes:|,tres-per-node:|,tres-per-job:|
    text = (
        "JOBID|ACCOUNT|USER|SUBMIT_TIME|REASON|NODES|TRES_PER_NODE|TRES_PER_JOB|\n"
        "1188|acme|gp-acme|2026-11-30T16:23:56|Resources|2|gres:gpu:rtx4090:2|N/A|\n"
        "1189|beta|gp-beta|2026-11-30T16:23:57|QOSGrpGRES|1|N/A|gres:gpu:3|\n"
        "1190|beta|gp-beta|2026-11-30T16:23:58|BeginTime|1|gres/gpu:1|N/A|\n"
    )
    jobs = parse_pending(text)
    assert [(j.slurm_job_id, j.account, j.gpus, j.gpu_type, j.reason) for j in jobs] == [
        ("1188", "acme", 4, "rtx4090", "Resources"),
        ("1189", "beta", 3, None, "QOSGrpGRES"),
        ("1190", "beta", 1, None, "BeginTime"),
    ]


def test_sreport_utilization_of_gres_gpu() -> None:
    text = (
        "--------------------------------------------------------------------------------\n"
        "Cluster Utilization 2026-11-30T16:00:00 - 2026-11-30T16:59:59\n"
        "Usage reported in TRES Seconds\n"
        "--------------------------------------------------------------------------------\n"
        "Cluster|TRES Name|Allocated|Down|PLND Down|Idle|Planned|Reported\n"
        "gpupool|gres/gpu|1234|600|0|11566|0|13400\n"
    )
    assert parse_sreport_utilization(text) is not None
    got = parse_sreport_utilization(text)
    assert got is not None and (got.allocated, got.down, got.idle, got.reported) == (1234, 600, 11566, 13400)
    # The relation sreport documents: the buckets add up to what was reported.
    assert got.allocated + got.down + got.planned_down + got.idle + got.planned == got.reported
    empty = text.rsplit("\n", 2)[0] + "\n"
    assert parse_sreport_utilization(empty) is None
    with pytest.raises(ParseError):
        parse_sreport_utilization(text.replace("1234", "12x"))
