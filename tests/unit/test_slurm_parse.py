"""Parsers for Slurm's delimited output, on literal strings.

Provenance of the literals (Slurm 22.05.8 on the local one-node cluster, TZ=UTC):

* RECORDED_* are verbatim output of
  ``squeue --states=all --user=root --format='%i|%T|%r|%V|%S|%e|%N|%k'``,
  ``sacct --allocations --parsable2 --format=JobIDRaw,State,ExitCode,Submit,Start,End,ElapsedRaw,NodeList,Reason``
  (over the jobs the integration suites had run by then) and
  ``sinfo --Node --partition=gpu --format='%N|%G'``; RECORDED_CFG_TRES is the
  node's CfgTRES from ``scontrol show node``.
* SQUEUE and SACCT are written by hand in exactly those formats, for states the
  cluster had not shown when recorded (pending on Resources, running, exit 2:0,
  signal 9, array tasks), following the recorded rows: squeue leaves NODELIST
  empty for a job that has no node, sacct prints ``Unknown`` for times not
  reached, ``None assigned`` as the node list of a job that never ran, and
  ``CANCELLED by <uid>``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from gpupool.slurm import (
    AccountingEntry,
    GpuInventory,
    QueueEntry,
    parse_accounting,
    parse_inventory,
    parse_queue,
)
from gpupool.slurm_parse import (
    GresEntry,
    ParseError,
    base_state,
    gpus_by_type,
    parse_delimited,
    parse_exit_code,
    parse_gres,
    parse_int,
    parse_time,
)

SQUEUE_HEADER = "JOBID|STATE|REASON|SUBMIT_TIME|START_TIME|END_TIME|NODELIST|COMMENT"  # recorded
SACCT_HEADER = "JobIDRaw|State|ExitCode|Submit|Start|End|ElapsedRaw|NodeList|Reason"  # recorded
RECORDED_SINFO = "NODELIST|GRES\nvm|gpu:rtx4090:4\n"  # recorded
RECORDED_CFG_TRES = "cpu=8,mem=16000M,billing=8,gres/gpu=4,gres/gpu:rtx4090=4"  # recorded

RECORDED_SQUEUE = """JOBID|STATE|REASON|SUBMIT_TIME|START_TIME|END_TIME|NODELIST|COMMENT
15|CANCELLED|ReqNodeNotAvail, UnavailableNodes:vm|2026-11-29T17:59:12|2026-11-29T17:59:12|2026-11-29T17:59:12||gpupool:80dab66f-22bc-4bce-8c03-caedd8e955f1
16|CANCELLED|ReqNodeNotAvail, UnavailableNodes:vm|2026-11-29T17:59:13|2026-11-29T17:59:13|2026-11-29T17:59:13||gpupool:0d65a3f9-f304-4b5d-9a4b-0d9011de8e2e
"""

# Single rows recorded verbatim from later squeue polls (the same command), one job at a time.
RECORDED_SQUEUE_ROWS = {
    "running": "17|RUNNING|None|2026-11-29T17:59:35|2026-11-29T17:59:36|2026-11-29T18:59:36|vm|gpupool:8bbc9296-ce47-40cc-9733-a96a3e499e32",
    "completing": "17|COMPLETING|None|2026-11-29T17:59:35|2026-11-29T17:59:36|2026-11-29T17:59:40|vm|gpupool:8bbc9296-ce47-40cc-9733-a96a3e499e32",
    "pending": "24|PENDING|None|2026-11-29T18:00:34|N/A|N/A||gpupool:2434e3db-b3ec-48ca-a42b-bbbd71f0f35b",
    "pending-no-comment": "18|PENDING|None|2026-11-29T18:00:14|N/A|N/A||(null)",
    "running-no-time-limit": "18|RUNNING|None|2026-11-29T18:00:14|2026-11-29T18:00:14|NONE|vm|(null)",
}

RECORDED_SACCT = """JobIDRaw|State|ExitCode|Submit|Start|End|ElapsedRaw|NodeList|Reason
1|COMPLETED|0:0|2026-11-29T17:55:25|2026-11-29T17:55:25|2026-11-29T17:55:26|1|vm|None
2|COMPLETED|0:0|2026-11-29T17:55:32|2026-11-29T17:55:32|2026-11-29T17:55:32|0|vm|None
3|COMPLETED|0:0|2026-11-29T17:57:06|2026-11-29T17:57:11|2026-11-29T17:57:12|1|vm|ReqNodeNotAvail
4|FAILED|3:0|2026-11-29T17:57:13|2026-11-29T17:57:14|2026-11-29T17:57:14|0|vm|None
5|COMPLETED|0:0|2026-11-29T17:57:15|2026-11-29T17:57:17|2026-11-29T17:57:17|0|vm|None
6|CANCELLED|0:15|2026-11-29T17:57:20|2026-11-29T17:57:20|2026-11-29T17:57:23|3|vm|None
7|COMPLETED|0:0|2026-11-29T17:57:21|2026-11-29T17:57:23|2026-11-29T17:57:23|0|vm|None
8|CANCELLED|0:15|2026-11-29T17:57:24|2026-11-29T17:57:26|2026-11-29T17:57:26|0|vm|None
9|COMPLETED|0:0|2026-11-29T17:57:27|2026-11-29T17:57:29|2026-11-29T17:57:29|0|vm|None
10|COMPLETED|0:0|2026-11-29T17:57:27|2026-11-29T17:57:29|2026-11-29T17:57:29|0|vm|None
11|COMPLETED|0:0|2026-11-29T17:57:27|2026-11-29T17:57:29|2026-11-29T17:57:29|0|vm|None
12|COMPLETED|0:0|2026-11-29T17:57:30|2026-11-29T17:57:32|2026-11-29T17:57:32|0|vm|None
13|CANCELLED by 0|0:0|2026-11-29T17:59:00|2026-11-29T17:59:00|2026-11-29T17:59:00|0|None assigned|None
14|CANCELLED by 0|0:0|2026-11-29T17:59:00|2026-11-29T17:59:00|2026-11-29T17:59:00|0|None assigned|None
15|CANCELLED by 0|0:0|2026-11-29T17:59:12|2026-11-29T17:59:12|2026-11-29T17:59:12|0|None assigned|None
16|CANCELLED by 0|0:0|2026-11-29T17:59:13|2026-11-29T17:59:13|2026-11-29T17:59:13|0|None assigned|None
"""


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=dt.UTC)


SQUEUE = f"""{SQUEUE_HEADER}
41|PENDING|Resources|2026-11-29T18:02:11|N/A|N/A||gpupool:j-0000000000000041
42|PENDING|Priority|2026-11-29T18:02:12|2026-11-29T19:01:06|2026-11-29T20:01:06||gpupool:j-0000000000000042
40|RUNNING|None|2026-11-29T18:01:05|2026-11-29T18:01:06|2026-11-29T19:01:06|vm|gpupool:j-0000000000000040
39|COMPLETED|None|2026-11-29T17:59:00|2026-11-29T17:59:01|2026-11-29T17:59:04|vm|gpupool:j-0000000000000039
38|CANCELLED|None|2026-11-29T17:58:00|2026-11-29T17:58:01|2026-11-29T17:58:30|vm|gpupool:j-0000000000000038
37|FAILED|NonZeroExitCode|2026-11-29T17:57:00|2026-11-29T17:57:01|2026-11-29T17:57:02|vm|gpupool:j-0000000000000037
36_4|RUNNING|None|2026-11-29T17:56:00|2026-11-29T17:56:01|2026-11-29T18:56:01|vm|(null)
36_[5-10]|PENDING|JobArrayTaskLimit|2026-11-29T17:56:00|N/A|N/A||(null)
"""

SACCT = f"""{SACCT_HEADER}
39|COMPLETED|0:0|2026-11-29T17:59:00|2026-11-29T17:59:01|2026-11-29T17:59:04|3|vm|None
37|FAILED|2:0|2026-11-29T17:57:00|2026-11-29T17:57:01|2026-11-29T17:57:02|1|vm|None
35|CANCELLED by 0|0:0|2026-11-29T17:50:00|2026-11-29T17:50:10|2026-11-29T17:55:10|300|vm|None
33|CANCELLED by 0|0:9|2026-11-29T17:40:00|2026-11-29T17:40:05|2026-11-29T17:41:05|60|vm|None
32|TIMEOUT|0:0|2026-11-29T16:00:00|2026-11-29T16:00:01|2026-11-29T17:00:31|3630|vm|None
30|PENDING|0:0|2026-11-29T18:02:11|Unknown|Unknown|0|None assigned|Resources
29|RUNNING|0:0|2026-11-29T18:01:05|2026-11-29T18:01:06|Unknown|120|vm|None
123_4|COMPLETED|0:0|2026-11-29T17:00:00|2026-11-29T17:00:01|2026-11-29T17:00:02|1|vm|None
"""


# --- parse_queue -----------------------------------------------------------------------


def test_parse_queue_exact() -> None:
    assert parse_queue(SQUEUE) == {
        41: QueueEntry(41, "PENDING", "Resources", utc(2026, 11, 29, 18, 2, 11), None, None, None, "gpupool:j-0000000000000041"),
        42: QueueEntry(42, "PENDING", "Priority", utc(2026, 11, 29, 18, 2, 12), None, None, None, "gpupool:j-0000000000000042"),
        40: QueueEntry(
            40, "RUNNING", None, utc(2026, 11, 29, 18, 1, 5), utc(2026, 11, 29, 18, 1, 6), None, "vm", "gpupool:j-0000000000000040"
        ),
        39: QueueEntry(
            39,
            "COMPLETED",
            None,
            utc(2026, 11, 29, 17, 59, 0),
            utc(2026, 11, 29, 17, 59, 1),
            utc(2026, 11, 29, 17, 59, 4),
            "vm",
            "gpupool:j-0000000000000039",
        ),
        38: QueueEntry(
            38,
            "CANCELLED",
            None,
            utc(2026, 11, 29, 17, 58, 0),
            utc(2026, 11, 29, 17, 58, 1),
            utc(2026, 11, 29, 17, 58, 30),
            "vm",
            "gpupool:j-0000000000000038",
        ),
        37: QueueEntry(
            37,
            "FAILED",
            "NonZeroExitCode",
            utc(2026, 11, 29, 17, 57, 0),
            utc(2026, 11, 29, 17, 57, 1),
            utc(2026, 11, 29, 17, 57, 2),
            "vm",
            "gpupool:j-0000000000000037",
        ),
    }


def test_parse_queue_pending_estimate_is_not_a_start() -> None:
    entry = parse_queue(SQUEUE)[42]
    assert (entry.state, entry.started_at, entry.ended_at, entry.node) == ("PENDING", None, None, None)


def test_parse_queue_running_end_is_only_the_time_limit() -> None:
    assert parse_queue(SQUEUE)[40].ended_at is None


def test_parse_queue_skips_array_ids() -> None:
    assert sorted(parse_queue(SQUEUE)) == [37, 38, 39, 40, 41, 42]


def test_parse_queue_header_only() -> None:
    assert parse_queue(SQUEUE_HEADER + "\n") == {}


def test_parse_queue_keys_on_header_not_position() -> None:
    text = (
        "COMMENT|NODELIST|END_TIME|START_TIME|SUBMIT_TIME|REASON|STATE|JOBID\n"
        "gpupool:j-1|vm|N/A|2026-11-29T18:01:06|2026-11-29T18:01:05|None|RUNNING|40\n"
    )
    assert parse_queue(text) == {
        40: QueueEntry(40, "RUNNING", None, utc(2026, 11, 29, 18, 1, 5), utc(2026, 11, 29, 18, 1, 6), None, "vm", "gpupool:j-1")
    }


def test_parse_queue_comment_may_hold_the_delimiter() -> None:
    text = f"{SQUEUE_HEADER}\n41|PENDING|Resources|2026-11-29T18:02:11|N/A|N/A||tag|with|pipes\n"
    assert parse_queue(text)[41].comment == "tag|with|pipes"


# --- parse_accounting ------------------------------------------------------------------


def test_parse_accounting_exact() -> None:
    entries = parse_accounting(SACCT)
    assert sorted(entries) == [29, 30, 32, 33, 35, 37, 39]
    assert entries[39] == AccountingEntry(
        39, "COMPLETED", 0, 0, utc(2026, 11, 29, 17, 59, 0), utc(2026, 11, 29, 17, 59, 1), utc(2026, 11, 29, 17, 59, 4), 3, "vm", None
    )
    assert entries[37] == AccountingEntry(
        37, "FAILED", 2, 0, utc(2026, 11, 29, 17, 57, 0), utc(2026, 11, 29, 17, 57, 1), utc(2026, 11, 29, 17, 57, 2), 1, "vm", None
    )
    assert entries[35] == AccountingEntry(
        35, "CANCELLED", 0, 0, utc(2026, 11, 29, 17, 50, 0), utc(2026, 11, 29, 17, 50, 10), utc(2026, 11, 29, 17, 55, 10), 300, "vm", None
    )
    assert entries[32] == AccountingEntry(
        32, "TIMEOUT", 0, 0, utc(2026, 11, 29, 16, 0, 0), utc(2026, 11, 29, 16, 0, 1), utc(2026, 11, 29, 17, 0, 31), 3630, "vm", None
    )
    assert entries[29] == AccountingEntry(
        29, "RUNNING", 0, 0, utc(2026, 11, 29, 18, 1, 5), utc(2026, 11, 29, 18, 1, 6), None, 120, "vm", None
    )


def test_parse_accounting_signal_exit() -> None:
    entry = parse_accounting(SACCT)[33]
    assert (entry.state, entry.exit_code, entry.exit_signal, entry.elapsed_s) == ("CANCELLED", 0, 9, 60)


def test_parse_accounting_pending_times_are_none() -> None:
    entry = parse_accounting(SACCT)[30]
    assert (entry.state, entry.started_at, entry.ended_at, entry.elapsed_s, entry.reason) == (
        "PENDING",
        None,
        None,
        0,
        "Resources",
    )


def test_parse_accounting_job_that_never_ran_has_no_node() -> None:
    # sacct prints "None assigned" as the NodeList of a job that never got nodes.
    assert parse_accounting(SACCT)[30].node is None


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (
            "running",
            QueueEntry(17, "RUNNING", None, utc(2026, 11, 29, 17, 59, 35), utc(2026, 11, 29, 17, 59, 36), None, "vm",
                       "gpupool:8bbc9296-ce47-40cc-9733-a96a3e499e32"),
        ),
        (
            "completing",
            QueueEntry(17, "COMPLETING", None, utc(2026, 11, 29, 17, 59, 35), utc(2026, 11, 29, 17, 59, 36),
                       utc(2026, 11, 29, 17, 59, 40), "vm", "gpupool:8bbc9296-ce47-40cc-9733-a96a3e499e32"),
        ),
        (
            "pending",
            QueueEntry(24, "PENDING", None, utc(2026, 11, 29, 18, 0, 34), None, None, None,
                       "gpupool:2434e3db-b3ec-48ca-a42b-bbbd71f0f35b"),
        ),
        ("pending-no-comment", QueueEntry(18, "PENDING", None, utc(2026, 11, 29, 18, 0, 14), None, None, None, "(null)")),
        (
            "running-no-time-limit",
            QueueEntry(18, "RUNNING", None, utc(2026, 11, 29, 18, 0, 14), utc(2026, 11, 29, 18, 0, 14), None, "vm", "(null)"),
        ),
    ],
    ids=["running", "completing", "pending", "pending-no-comment", "running-no-time-limit"],
)
def test_parse_queue_recorded_rows(row: str, expected: QueueEntry) -> None:
    assert parse_queue(f"{SQUEUE_HEADER}\n{RECORDED_SQUEUE_ROWS[row]}\n") == {expected.slurm_job_id: expected}


def test_parse_queue_suspended_job_without_time_limit() -> None:
    # squeue prints END_TIME "NONE" for a job with no time limit (recorded above for a
    # running one); a suspended or configuring one must not break the whole queue.
    text = f"{SQUEUE_HEADER}\n18|SUSPENDED|None|2026-11-29T18:00:14|2026-11-29T18:00:14|NONE|vm|(null)\n"
    assert parse_queue(text) == {
        18: QueueEntry(18, "SUSPENDED", None, utc(2026, 11, 29, 18, 0, 14), utc(2026, 11, 29, 18, 0, 14), None, "vm", "(null)")
    }


def test_parse_accounting_recorded() -> None:
    entries = parse_accounting(RECORDED_SACCT)
    assert sorted(entries) == list(range(1, 17))
    assert entries[1] == AccountingEntry(
        1, "COMPLETED", 0, 0, utc(2026, 11, 29, 17, 55, 25), utc(2026, 11, 29, 17, 55, 25), utc(2026, 11, 29, 17, 55, 26), 1, "vm", None
    )
    assert entries[3].reason == "ReqNodeNotAvail"
    assert entries[4] == AccountingEntry(
        4, "FAILED", 3, 0, utc(2026, 11, 29, 17, 57, 13), utc(2026, 11, 29, 17, 57, 14), utc(2026, 11, 29, 17, 57, 14), 0, "vm", None
    )
    assert entries[6] == AccountingEntry(
        6, "CANCELLED", 0, 15, utc(2026, 11, 29, 17, 57, 20), utc(2026, 11, 29, 17, 57, 20), utc(2026, 11, 29, 17, 57, 23), 3, "vm", None
    )
    assert [entries[i].state for i in (13, 14, 15, 16)] == ["CANCELLED"] * 4
    assert (entries[13].exit_code, entries[13].exit_signal, entries[13].elapsed_s) == (0, 0, 0)


def test_parse_accounting_recorded_cancelled_while_pending_has_no_node() -> None:
    # Recorded: jobs 13-16 were cancelled before they got a node; sacct says "None assigned".
    entries = parse_accounting(RECORDED_SACCT)
    assert entries[15] == AccountingEntry(
        15, "CANCELLED", 0, 0, utc(2026, 11, 29, 17, 59, 12), utc(2026, 11, 29, 17, 59, 12), utc(2026, 11, 29, 17, 59, 12), 0, None, None
    )
    assert [entries[i].node for i in (13, 14, 15, 16)] == [None] * 4


def test_parse_queue_recorded() -> None:
    assert parse_queue(RECORDED_SQUEUE) == {
        15: QueueEntry(
            15,
            "CANCELLED",
            "ReqNodeNotAvail, UnavailableNodes:vm",
            utc(2026, 11, 29, 17, 59, 12),
            utc(2026, 11, 29, 17, 59, 12),
            utc(2026, 11, 29, 17, 59, 12),
            None,
            "gpupool:80dab66f-22bc-4bce-8c03-caedd8e955f1",
        ),
        16: QueueEntry(
            16,
            "CANCELLED",
            "ReqNodeNotAvail, UnavailableNodes:vm",
            utc(2026, 11, 29, 17, 59, 13),
            utc(2026, 11, 29, 17, 59, 13),
            utc(2026, 11, 29, 17, 59, 13),
            None,
            "gpupool:0d65a3f9-f304-4b5d-9a4b-0d9011de8e2e",
        ),
    }


def test_parse_accounting_skips_array_ids() -> None:
    assert 123 not in parse_accounting(SACCT)
    assert parse_accounting(f"{SACCT_HEADER}\n123_4|COMPLETED|0:0|Unknown|Unknown|Unknown|1|vm|None\n") == {}


def test_parse_accounting_keys_on_header() -> None:
    text = "Reason|NodeList|ElapsedRaw|End|Start|Submit|ExitCode|State|JobIDRaw\nNone|vm|7|None|Unknown|2026-11-29T17:00:00|1:0|FAILED|9\n"
    assert parse_accounting(text) == {9: AccountingEntry(9, "FAILED", 1, 0, utc(2026, 11, 29, 17, 0, 0), None, None, 7, "vm", None)}


# --- parse_inventory -------------------------------------------------------------------


def test_parse_inventory_recorded() -> None:
    assert parse_inventory(RECORDED_SINFO) == GpuInventory(max_per_node=4, max_per_node_by_type={"rtx4090": 4})


def test_parse_inventory_several_nodes_and_types() -> None:
    text = "NODELIST|GRES\nn1|gpu:rtx4090:4(S:0-1)\nn2|gpu:a100:2(S:0),gpu:rtx4090:1(S:1)\nn3|(null)\nn4|shard:8,gpu:1\n"
    assert parse_inventory(text) == GpuInventory(max_per_node=4, max_per_node_by_type={"rtx4090": 4, "a100": 2})


def test_parse_inventory_keys_on_header() -> None:
    assert parse_inventory("GRES|NODELIST\ngpu:rtx4090:3|n1\n") == GpuInventory(3, {"rtx4090": 3})


# --- missing or malformed header -------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n", "  \n\n"])
@pytest.mark.parametrize("parse", [parse_delimited, parse_queue, parse_accounting, parse_inventory])
def test_no_header_line(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(ParseError, match="no header line"):
        parse(text)


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_queue, "41|PENDING|Resources|2026-11-29T18:02:11|N/A|N/A||gpupool:j-0000000000000041\n"),
        (parse_accounting, "39|COMPLETED|0:0|2026-11-29T17:59:00|2026-11-29T17:59:01|2026-11-29T17:59:04|3|vm|None\n"),
        (parse_inventory, "vm|gpu:rtx4090:4\n"),
    ],
    ids=["squeue", "sacct", "sinfo"],
)
def test_headerless_output_is_a_parse_error(parse: Callable[[str], object], text: str) -> None:
    # Output without its header row must not be read as "no jobs" / "no GPUs".
    with pytest.raises(ParseError):
        parse(text)


def test_row_with_too_few_fields() -> None:
    with pytest.raises(ParseError, match="expected 3 fields, got 2"):
        parse_delimited("A|B|C\n1|2\n")


# --- parse_delimited -------------------------------------------------------------------


def test_parse_delimited_last_column_keeps_delimiter_and_newlines() -> None:
    text = "A|B|C\n1|2|x|y\nsecond line\nthird|line\n3|4|w\n"
    assert parse_delimited(text) == [
        {"A": "1", "B": "2", "C": "x|y\nsecond line\nthird|line"},
        {"A": "3", "B": "4", "C": "w"},
    ]


def test_parse_delimited_strips_header_and_skips_leading_blank_lines() -> None:
    assert parse_delimited("\n\n A | B \n1|2\n") == [{"A": "1", "B": "2"}]


def test_parse_delimited_other_delimiter() -> None:
    assert parse_delimited("A;B\n1;2;3\n", delimiter=";") == [{"A": "1", "B": "2;3"}]


def test_parse_delimited_empty_fields() -> None:
    assert parse_delimited("A|B|C\n||\n") == [{"A": "", "B": "", "C": ""}]


# --- small parsers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (RECORDED_CFG_TRES, {"rtx4090": 4}),
        ("cpu=1,mem=4G,node=1,billing=1,gres/gpu=2,gres/gpu:rtx4090=2", {"rtx4090": 2}),
        ("gres/gpu:rtx4090=2,gres/gpu=2", {"rtx4090": 2}),
        ("cpu=1,gres/gpu:rtx4090=2", {"rtx4090": 2}),
        ("gres/gpu=3", {"untyped": 3}),
        ("gres/gpu=3,gres/gpu:a100=1,gres/gpu:rtx4090=2", {"a100": 1, "rtx4090": 2}),
        ("gres/gpu=4,gres/gpu:rtx4090=2", {"rtx4090": 2, "untyped": 2}),
        ("gres/gpu:a100=1,gres/gpu:rtx4090=2", {"a100": 1, "rtx4090": 2}),
        ("gres/gpumem=24G,gres/gpu=1", {"untyped": 1}),
        ("gres/gpu=0", {}),
        ("cpu=1,mem=4G", {}),
        ("", {}),
    ],
)
def test_gpus_by_type_never_adds_typed_and_untyped_keys(text: str, expected: dict[str, int]) -> None:
    assert gpus_by_type(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:rtx4090:4(S:0-1)", [GresEntry("gpu", "rtx4090", 4)]),
        ("gpu:rtx4090:4", [GresEntry("gpu", "rtx4090", 4)]),
        (
            "gpu:rtx4090:4(S:0-1),gpu:a100:2(S:0,1),shard:8",
            [GresEntry("gpu", "rtx4090", 4), GresEntry("gpu", "a100", 2), GresEntry("shard", None, 8)],
        ),
        ("gpu:2", [GresEntry("gpu", None, 2)]),
        ("gpu:tesla", [GresEntry("gpu", "tesla", 1)]),
        ("gpu", [GresEntry("gpu", None, 1)]),
        ("(null)", []),
        ("", []),
    ],
)
def test_parse_gres(text: str, expected: list[GresEntry]) -> None:
    assert parse_gres(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-29T18:02:11", utc(2026, 11, 29, 18, 2, 11)),
        (" 2026-01-02T03:04:05 ", utc(2026, 1, 2, 3, 4, 5)),
        ("Unknown", None),
        ("None", None),
        ("N/A", None),
        ("(null)", None),
        ("NONE", None),
        ("", None),
    ],
)
def test_parse_time(text: str, expected: dt.datetime | None) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize("text", ["yesterday", "2026-11-29 18:02:11", "1700000000"])
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ParseError, match="not a Slurm timestamp"):
        parse_time(text)


@pytest.mark.parametrize(
    ("text", "expected"), [("2:0", (2, 0)), ("0:9", (0, 9)), ("0:0", (0, 0)), ("137", (137, 0)), ("", (None, None))]
)
def test_parse_exit_code(text: str, expected: tuple[int | None, int | None]) -> None:
    assert parse_exit_code(text) == expected


def test_parse_exit_code_rejects() -> None:
    with pytest.raises(ParseError, match="not a Slurm exit code"):
        parse_exit_code("x:y")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("CANCELLED by 0", "CANCELLED"), ("CANCELLED+", "CANCELLED"), ("RUNNING", "RUNNING"), (" COMPLETED ", "COMPLETED")],
)
def test_base_state(text: str, expected: str) -> None:
    assert base_state(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("123", 123), (" 42 ", 42), ("123_4", None), ("123_[5-10]", None), ("7+0", None), ("", None)]
)
def test_parse_int(text: str, expected: int | None) -> None:
    assert parse_int(text) == expected
