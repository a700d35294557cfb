"""sacct accounting output into job runs, on recorded and literal outputs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from billing.sacct import SACCT_FIELDS, JobRun, detect_delimiter, parse_runs
from gpupool.slurm_parse import ParseError

FIXTURES = Path(__file__).parent / "fixtures" / "sacct"


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def test_recorded_requeue_array_and_pipe_name() -> None:
    """Recorded on the local cluster: a 2-GPU job named 'weird|name\\nline2', a requeued
    job (first run REQUEUED, second cancelled before it started) and a 2-task array."""
    parsed = parse_runs((FIXTURES / "requeue-array-pipe.psv").read_text())
    assert parsed.rows == 5
    assert parsed.runs == [
        JobRun("gpupool", 10, "10", "bx", "COMPLETED", utc("2026-11-29T19:19:44"), utc("2026-11-29T19:19:47"), 3, {"rtx4090": 2}, "weird|name\nline2"),
        JobRun("gpupool", 11, "11", "bx", "REQUEUED", utc("2026-11-29T19:19:44"), utc("2026-11-29T19:20:10"), 26, {"rtx4090": 1}, "req"),
        JobRun("gpupool", 13, "12_0", "bx", "COMPLETED", utc("2026-11-29T19:19:48"), utc("2026-11-29T19:19:50"), 2, {"rtx4090": 1}, "arr"),
        JobRun("gpupool", 12, "12_1", "bx", "COMPLETED", utc("2026-11-29T19:19:48"), utc("2026-11-29T19:19:50"), 2, {"rtx4090": 1}, "arr"),
    ]


HEADER = "|".join(SACCT_FIELDS)


def test_heterogeneous_components_are_billed_individually() -> None:
    text = (
        f"{HEADER}\n"
        "c|40|40+0|acme|u|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:10|2026-11-01T00:01:10|60|cpu=1,gres/gpu=1,gres/gpu:rtx3090=1|het\n"
        "c|41|40+1|acme|u|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:10|2026-11-01T00:01:10|60|cpu=1,gres/gpu=2,gres/gpu:rtx4090=2|het\n"
    )
    runs = parse_runs(text).runs
    assert [(run.job_id, run.job_id_raw, run.gpus) for run in runs] == [
        ("40+0", 40, {"rtx3090": 1}),
        ("40+1", 41, {"rtx4090": 2}),
    ]


@pytest.mark.parametrize(
    "row",
    [
        # cancelled while pending: no start, no allocation
        "c|50|50|acme|u|CANCELLED by 1000|2026-11-01T00:00:00|None|2026-11-01T00:05:00|0||never",
        "c|51|51|acme|u|PENDING|2026-11-01T00:00:00|Unknown|Unknown|0||waiting",
        # ran, but held no GPU
        "c|52|52|acme|u|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:01|2026-11-01T00:01:01|60|cpu=4,mem=1G,node=1|cpu",
        # a step, in output read without -X
        "c|54.batch|54.batch|acme|u|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:01|2026-11-01T00:01:01|60|cpu=1,gres/gpu=1|batch",
    ],
)
def test_rows_that_bill_nothing(row: str) -> None:
    parsed = parse_runs(f"{HEADER}\n{row}\n")
    assert parsed.runs == []
    assert parsed.rows == 1


def test_cancelled_while_running_bills_its_elapsed_time() -> None:
    row = "c|55|55|acme|u|CANCELLED by 0|2026-11-01T00:00:00|2026-11-01T00:00:05|2026-11-01T00:00:47|42|cpu=1,gres/gpu=1,gres/gpu:rtx4090=1|x"
    (run,) = parse_runs(f"{HEADER}\n{row}\n").runs
    assert (run.state, run.elapsed_s, run.finished) == ("CANCELLED", 42, True)


def test_running_job_is_unfinished_and_has_no_end() -> None:
    row = "c|56|56|acme|u|RUNNING|2026-11-01T00:00:00|2026-11-01T00:00:05|Unknown|300|cpu=1,gres/gpu=4,gres/gpu:rtx4090=4|long"
    (run,) = parse_runs(f"{HEADER}\n{row}\n").runs
    assert (run.end, run.finished, run.gpus) == (None, False, {"rtx4090": 4})


def test_a_job_name_cannot_forge_a_row_under_a_nonce_delimiter() -> None:
    """With the worker's unpredictable delimiter, a name holding '|'-separated fields and a newline stays a name."""
    nonce = "|5f2a9c7e01bd|"
    forged = "x\nc|99|99|victim|u|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:01|2026-11-01T10:00:01|36000|gres/gpu=4|forged"
    row = nonce.join(
        ["c", "57", "57", "mallory", "u", "COMPLETED", "2026-11-01T00:00:00", "2026-11-01T00:00:01", "2026-11-01T00:00:11", "10", "gres/gpu=1", forged]
    )
    parsed = parse_runs(nonce.join(SACCT_FIELDS) + "\n" + row + "\n", delimiter=nonce)
    assert [(run.account, run.job_id_raw, run.name) for run in parsed.runs] == [("mallory", 57, forged)]


@pytest.mark.parametrize("delimiter", ["|", "|5f2a9c7e01bd|", ";", "\x1f"])
def test_detect_delimiter(delimiter: str) -> None:
    assert detect_delimiter(delimiter.join(SACCT_FIELDS)) == delimiter
    assert detect_delimiter(delimiter.join(["JobIDRaw", "Account", "State"])) == delimiter


def test_detect_delimiter_refuses_a_line_without_field_names() -> None:
    with pytest.raises(ParseError, match="delimiter"):
        detect_delimiter("10|10|bx|COMPLETED")


def test_output_without_a_cluster_column_needs_one_named() -> None:
    text = "JobIDRaw|Account|State|Start|ElapsedRaw|AllocTRES\n7|acme|COMPLETED|2026-11-01T00:00:00|10|gres/gpu=1\n"
    with pytest.raises(ParseError, match="Cluster"):
        parse_runs(text)
    assert parse_runs(text, default_cluster="east").runs[0].cluster == "east"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("JobIDRaw|Account|State\n1|a|COMPLETED\n", "lacks column"),
        (f"{HEADER}\nc|1|1|a|u|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:00|2026-11-01T00:01:00|1:00|gres/gpu=1|n\n", "ElapsedRaw"),
        ("Cluster|JobIDRaw|JobName|Account|State|Start|ElapsedRaw|AllocTRES\n", "JobName must be the last"),
        ("", "no header"),
        # The one timestamp rule (slurm_parse.parse_time) holds in the billing hot path too.
        (f"{HEADER}\nc|1|1|a|u|COMPLETED|2026-11-01T00:00:00|2026-11-01 00:00:00|2026-11-01T00:01:00|60|gres/gpu=1|n\n", "not a Slurm timestamp"),
    ],
)
def test_malformed_output_is_refused(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_runs(text)
