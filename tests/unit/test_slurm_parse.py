"""Parsers for Slurm's delimited output, on literal strings.

Provenance of the literals (Slurm 22.05.8 on the local one-node cluster, TZ=UTC):

* ``fixtures/squeue/forged-comments.txt`` is verbatim output of
  ``SQUEUE_FORMAT=<queue_format(RECORDED)> squeue --states=all --jobs=74,75,76,77``,
  the job-state query with the recorded delimiter RECORDED in place of a fresh
  one: tenant B's running job 74 and completed job 75, tenant A's failed job 76
  (comment ``gpupool:fail|with|pipes``) and A's held job 77, whose comment
  (``sbatch --hold --comment=...``) is a newline, then a row for job 74 in the
  old layout (``%i|%T|%r|%V|%S|%e|%N|%k|%u|%a``), one in today's layout with ``|``,
  one whose submit time is no time, ``a'; echo foo`` and ``0``.
  ``forged-comments-old-layout.txt`` is the same four jobs through the old
  ``--format=%i|%T|%r|%V|%S|%e|%N|%k|%u|%a``.
* ``fixtures/sacct/job-state.txt`` is verbatim
  ``sacct --allusers --allocations --parsable2 --delimiter=<RECORDED> --format=<_ACCT_FIELDS> --jobs=74,75,76,77``
  a few seconds later.
* RECORDED_SINFO is ``sinfo --Node --partition=gpu --format='%N|%G'``; RECORDED_CFG_TRES
  is the node's CfgTRES from ``scontrol show node``.
* SQUEUE and SACCT are written by hand in exactly those formats, for states the
  cluster had not shown when recorded (pending on Resources, exit 2:0, signal 9,
  timeout, array tasks), following the recorded rows: squeue leaves NODELIST
  empty for a job that has no node and prints ``(null)`` for no comment, sacct
  prints ``Unknown`` for times not reached, ``None assigned`` as the node list of
  a job that never ran, and ``CANCELLED by <uid>``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpupool.config import Settings
from gpupool.jobstate import JobStateRefresher, SlurmAnswers
from gpupool.models import Job
from gpupool.proc import CommandResult
from gpupool.slurm.client import (
    AccountingEntry,
    GpuInventory,
    QueueEntry,
    SlurmClient,
    parse_accounting,
    parse_inventory,
    parse_queue,
    queue_format,
)
from gpupool.slurm.parse import (
    GresEntry,
    ParseError,
    base_state,
    gpus_by_type,
    is_unpredictable,
    numbered_rows,
    parse_delimited,
    parse_exit_code,
    parse_gres,
    parse_int,
    parse_time,
    unpredictable_delimiter,
)

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = "|5f2a9c7e01bd|"  # the delimiter the recordings were made with
RECORDED_SQUEUE = (FIXTURES / "squeue" / "forged-comments.txt").read_text()
RECORDED_SQUEUE_OLD_LAYOUT = (FIXTURES / "squeue" / "forged-comments-old-layout.txt").read_text()
RECORDED_SACCT = (FIXTURES / "sacct" / "job-state.txt").read_text()
RECORDED_SINFO = "NODELIST|GRES\nvm|gpu:rtx4090:4\n"  # recorded
RECORDED_CFG_TRES = "cpu=8,mem=16000M,billing=8,gres/gpu=4,gres/gpu:rtx4090=4"  # recorded
TENANT_A, TENANT_B = "ra1b984f09", "rbc87aed75"  # the recording's accounts
HELD_COMMENT = (
    "x\n"
    f"74|PENDING|Forged|2026-12-01T00:00:00|N/A|N/A||(null)|gp-{TENANT_B}|{TENANT_B}\n"
    f"74|PENDING|Forged|2026-12-01T00:00:00|N/A|N/A||gp-{TENANT_B}|{TENANT_B}|(null)\n"
    f"74|PENDING|Forged|notatime|N/A|N/A||gp-{TENANT_B}|{TENANT_B}|(null)\n"
    "a'; echo foo\n"
    "0"
)


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=dt.UTC)


def rows(*lines: list[str], delimiter: str = RECORDED) -> str:
    """squeue's job-state output, header first, with ``delimiter``."""
    header = ["JOBID", "STATE", "REASON", "SUBMIT_TIME", "START_TIME", "END_TIME", "NODELIST", "USER", "ACCOUNT", "COMMENT"]
    return "\n".join(delimiter.join(fields) for fields in (header, *lines)) + "\n"


SQUEUE = rows(
    ["41", "PENDING", "Resources", "2026-11-29T18:02:11", "N/A", "N/A", "", "gp-acme", "acme", "gpupool:j-41"],
    ["42", "PENDING", "Priority", "2026-11-29T18:02:12", "2026-11-29T19:01:06", "2026-11-29T20:01:06", "", "gp-acme", "acme", "gpupool:j-42"],
    ["40", "RUNNING", "None", "2026-11-29T18:01:05", "2026-11-29T18:01:06", "2026-11-29T19:01:06", "vm", "gp-acme", "acme", "gpupool:j-40"],
    ["39", "COMPLETING", "None", "2026-11-29T17:59:00", "2026-11-29T17:59:01", "2026-11-29T17:59:04", "vm", "gp-acme", "acme", "gpupool:j-39"],
    ["38", "CANCELLED", "None", "2026-11-29T17:58:00", "2026-11-29T17:58:01", "2026-11-29T17:58:30", "vm", "gp-acme", "acme", "gpupool:j-38"],
    ["18", "RUNNING", "None", "2026-11-29T18:00:14", "2026-11-29T18:00:14", "NONE", "vm", "gp-acme", "acme", "(null)"],
    ["36_4", "RUNNING", "None", "2026-11-29T17:56:00", "2026-11-29T17:56:01", "2026-11-29T18:56:01", "vm", "gp-acme", "acme", "(null)"],
    ["36_[5-10]", "PENDING", "JobArrayTaskLimit", "2026-11-29T17:56:00", "N/A", "N/A", "", "gp-acme", "acme", "(null)"],
)

SACCT_HEADER = "JobIDRaw|State|ExitCode|Submit|Start|End|ElapsedRaw|NodeList|Reason|User|Account"
SACCT = f"""{SACCT_HEADER}
37|FAILED|2:0|2026-11-29T17:57:00|2026-11-29T17:57:01|2026-11-29T17:57:02|1|vm|None|gp-acme|acme
35|CANCELLED by 0|0:0|2026-11-29T17:50:00|2026-11-29T17:50:10|2026-11-29T17:55:10|300|vm|None|gp-acme|acme
33|CANCELLED by 0|0:9|2026-11-29T17:40:00|2026-11-29T17:40:05|2026-11-29T17:41:05|60|vm|None|gp-acme|Acme
32|TIMEOUT|0:0|2026-11-29T16:00:00|2026-11-29T16:00:01|2026-11-29T17:00:31|3630|vm|None|gp-acme|acme
30|PENDING|0:0|2026-11-29T18:02:11|Unknown|Unknown|0|None assigned|Resources|gp-acme|acme
123_4|COMPLETED|0:0|2026-11-29T17:00:00|2026-11-29T17:00:01|2026-11-29T17:00:02|1|vm|None|gp-acme|acme
""".replace("|", RECORDED)


# --- parse_queue: recorded ---------------------------------------------------------------


def test_recorded_queue_keeps_every_comment_as_text_and_forges_no_row() -> None:
    queue = parse_queue(RECORDED_SQUEUE, RECORDED)
    assert queue == {
        75: QueueEntry(75, "COMPLETED", None, utc(2026, 12, 1, 20, 51, 53), utc(2026, 12, 1, 20, 51, 54),
                       utc(2026, 12, 1, 20, 51, 54), "vm", "", f"gp-{TENANT_B}", TENANT_B),
        76: QueueEntry(76, "FAILED", "NonZeroExitCode", utc(2026, 12, 1, 20, 51, 53), utc(2026, 12, 1, 20, 51, 54),
                       utc(2026, 12, 1, 20, 51, 54), "vm", "gpupool:fail|with|pipes", f"gp-{TENANT_A}", TENANT_A),
        77: QueueEntry(77, "PENDING", "JobHeldUser", utc(2026, 12, 1, 20, 51, 56), None, None, None, HELD_COMMENT,
                       f"gp-{TENANT_A}", TENANT_A),
        # B's job is what Slurm says it is: running since 20:51:54, with its own tag.
        74: QueueEntry(74, "RUNNING", None, utc(2026, 12, 1, 20, 51, 53), utc(2026, 12, 1, 20, 51, 54), None, "vm",
                       "gpupool:0b7e2d4c-victim", f"gp-{TENANT_B}", TENANT_B),
    }
    assert queue.refused == ()


def test_the_old_layout_is_refused_not_misread() -> None:
    """The comment mid-row, as before: the reader names the column that must be last."""
    with pytest.raises(ParseError, match="COMMENT must be the last column"):
        parse_queue(RECORDED_SQUEUE_OLD_LAYOUT, "|")


def test_under_a_guessable_delimiter_forged_rows_are_refused_or_disbelieved() -> None:
    """The held job's comment, read as if the delimiter were '|': no line of it is joined to a
    comment, the malformed row is refused alone, and job 74, listed twice, is believed from neither row."""
    text = RECORDED_SQUEUE.replace(RECORDED, "|")
    queue = parse_queue(text, "|")
    assert sorted(queue) == [75, 76, 77]
    assert queue[77].comment == "x"
    assert queue.refused == (
        # Line 5, the old layout's row, has the width of a row: job 74 as user "(null)", the first of three.
        "squeue line 6: job 74 listed again; none of its rows is believed",
        "squeue line 7: not a Slurm timestamp: 'notatime'",
        "squeue line 8: 1 field(s) where the header names 10",
        "squeue line 9: 1 field(s) where the header names 10",
        "squeue line 10: job 74 listed again; none of its rows is believed",
    )


# --- parse_queue: hand-written ---------------------------------------------------------


def test_parse_queue_exact() -> None:
    queue = parse_queue(SQUEUE, RECORDED)
    acme = ("gp-acme", "acme")
    assert queue == {
        41: QueueEntry(41, "PENDING", "Resources", utc(2026, 11, 29, 18, 2, 11), None, None, None, "gpupool:j-41", *acme),
        # A pending job's START_TIME is an estimate, not a start.
        42: QueueEntry(42, "PENDING", "Priority", utc(2026, 11, 29, 18, 2, 12), None, None, None, "gpupool:j-42", *acme,
                       expected_start=utc(2026, 11, 29, 19, 1, 6)),
        # A running job's END_TIME is only its time limit.
        40: QueueEntry(40, "RUNNING", None, utc(2026, 11, 29, 18, 1, 5), utc(2026, 11, 29, 18, 1, 6), None, "vm", "gpupool:j-40", *acme),
        39: QueueEntry(39, "COMPLETING", None, utc(2026, 11, 29, 17, 59, 0), utc(2026, 11, 29, 17, 59, 1),
                       utc(2026, 11, 29, 17, 59, 4), "vm", "gpupool:j-39", *acme),
        38: QueueEntry(38, "CANCELLED", None, utc(2026, 11, 29, 17, 58, 0), utc(2026, 11, 29, 17, 58, 1),
                       utc(2026, 11, 29, 17, 58, 30), "vm", "gpupool:j-38", *acme),
        # No time limit: END_TIME "NONE"; no comment: "(null)".
        18: QueueEntry(18, "RUNNING", None, utc(2026, 11, 29, 18, 0, 14), utc(2026, 11, 29, 18, 0, 14), None, "vm", "", *acme),
    }
    assert queue.refused == ()


def test_parse_queue_header_only() -> None:
    assert parse_queue(rows(), RECORDED) == {}


def test_parse_queue_keys_on_header_not_position() -> None:
    header = ["NODELIST", "USER", "END_TIME", "START_TIME", "ACCOUNT", "SUBMIT_TIME", "REASON", "STATE", "JOBID", "COMMENT"]
    row = ["vm", "gp-acme", "N/A", "2026-11-29T18:01:06", "acme", "2026-11-29T18:01:05", "None", "RUNNING", "40", "gpupool:j-1"]
    text = RECORDED.join(header) + "\n" + RECORDED.join(row) + "\n"
    assert parse_queue(text, RECORDED) == {
        40: QueueEntry(40, "RUNNING", None, utc(2026, 11, 29, 18, 1, 5), utc(2026, 11, 29, 18, 1, 6), None, "vm", "gpupool:j-1", "gp-acme", "acme")
    }


def pending(job_id: str, comment: str, user: str = "gp-acme", account: str = "acme", submitted: str = "2026-11-29T18:02:11") -> list[str]:
    return [job_id, "PENDING", "JobHeldUser", submitted, "N/A", "N/A", "", user, account, comment]


@pytest.mark.parametrize(
    "comment",
    [
        "a'; echo foo",
        "a\n0",
        "tag|with|pipes",
        "x\n43|RUNNING|None|2026-11-29T18:02:11|2026-11-29T18:02:12|N/A|vm|gp-other|other|gpupool:j-43",
        f"x\n43{RECORDED[:-1]}",  # a delimiter's shape, but not this call's
        "x\u2028" + "|".join(pending("43", "y", "gp-other", "other")),  # a line end to str.splitlines, not to Slurm
        "x\r" + "|".join(pending("43", "y", "gp-other", "other")),
        "\n\n",
    ],
    ids=["quote", "newline", "pipes", "forged-row", "near-delimiter", "u2028", "cr", "blank-lines"],
)
def test_a_comment_is_text_whatever_it_holds(comment: str) -> None:
    text = rows(pending("41", comment), pending("42", "gpupool:j-42"))
    queue = parse_queue(text, RECORDED)
    assert sorted(queue) == [41, 42] and queue.refused == ()
    assert queue[41].comment == comment.strip()
    assert queue[42].comment == "gpupool:j-42"


def test_one_bad_row_is_refused_alone_with_its_line() -> None:
    text = rows(
        pending("41", "gpupool:j-41"),
        pending("42", "gpupool:j-42", submitted="yesterday"),
        ["43", "COMPLETED", "None", "2026-11-29T18:02:11", "2026-11-29T18:02:12", "1700000000", "vm", "gp-acme", "acme", ""],
        pending("44", "gpupool:j-44"),
    )
    queue = parse_queue(text, RECORDED)
    assert sorted(queue) == [41, 44]
    assert queue.refused == (
        "squeue line 3: not a Slurm timestamp: 'yesterday'",
        "squeue line 4: not a Slurm timestamp: '1700000000'",
    )


def test_under_the_calls_delimiter_a_short_line_is_more_of_the_comment_above() -> None:
    text = rows(pending("41", "gpupool:j-41"), ["43", "RUNNING"], pending("44", "gpupool:j-44"))
    queue = parse_queue(text, RECORDED)
    assert queue[41].comment == f"gpupool:j-41\n43{RECORDED}RUNNING" and sorted(queue) == [41, 44]


def test_a_job_listed_twice_is_believed_from_neither_row() -> None:
    text = rows(pending("41", "gpupool:j-41"), pending("42", "gpupool:j-42"), pending("41", "gpupool:j-41", "gp-evil", "evil"))
    queue = parse_queue(text, RECORDED)
    assert sorted(queue) == [42]
    assert queue.refused == ("squeue line 4: job 41 listed again; none of its rows is believed",)
    # A third row changes nothing: the first one does not come back.
    assert sorted(parse_queue(text + RECORDED.join(pending("41", "gpupool:j-41")) + "\n", RECORDED)) == [42]


def test_a_short_line_before_any_row_is_refused_not_fatal() -> None:
    text = rows(["oops"], pending("41", "gpupool:j-41"))
    queue = parse_queue(text, RECORDED)
    assert sorted(queue) == [41] and queue.refused == ("squeue line 2: 1 field(s) where the header names 10",)


@pytest.mark.parametrize(
    "header",
    [
        "JOBID|STATE|REASON|SUBMIT_TIME|START_TIME|END_TIME|NODELIST|COMMENT|USER|ACCOUNT",
        "JOBID|STATE|REASON|SUBMIT_TIME|START_TIME|END_TIME|NODELIST|COMMENT",
    ],
)
def test_the_comment_must_be_last_and_user_and_account_present(header: str) -> None:
    with pytest.raises(ParseError):
        parse_queue(header.replace("|", RECORDED) + "\n", RECORDED)


# --- the job-state squeue call ---------------------------------------------------------


def test_queue_passes_a_fresh_delimiter_in_the_environment_not_the_command_line() -> None:
    calls: list[tuple[tuple[str, ...], dict[str, str]]] = []

    def squeue(argv: list[str], **kwargs: Any) -> CommandResult:
        env = dict(kwargs["env"])
        calls.append((tuple(argv), env))
        delimiter = env["SQUEUE_FORMAT"].split("%")[2][1:]  # between "%i" and "%T"
        text = rows(pending("41", f"gpupool:j-41\n42{delimiter}"), delimiter=delimiter)
        return CommandResult(tuple(argv), 0, text, "", 0.0)

    client = SlurmClient(Settings(service_user="gpupool", service_group="gpupool"), runner=squeue, tenants=object())  # type: ignore[arg-type]
    first, second = client.queue(), client.queue()
    assert sorted(first) == sorted(second) == [41]
    (argv_1, env_1), (argv_2, env_2) = calls
    delimiters = [env["SQUEUE_FORMAT"].split("%")[2][1:] for env in (env_1, env_2)]
    assert all(is_unpredictable(delimiter) for delimiter in delimiters) and delimiters[0] != delimiters[1]
    assert env_1["SQUEUE_FORMAT"] == queue_format(delimiters[0]) and env_1["SQUEUE_FORMAT"].endswith("%k")
    assert not any(delimiters[0] in arg for arg in argv_1)  # /proc/<pid>/cmdline shows argv to every user


def test_unpredictable_delimiters_differ() -> None:
    made = {unpredictable_delimiter() for _ in range(100)}
    assert len(made) == 100 and all(is_unpredictable(delimiter) for delimiter in made)
    assert not is_unpredictable("|") and not is_unpredictable("|5f2a9c7e01bd") and not is_unpredictable("|5F2A9C7E01BD|")


# --- parse_accounting ------------------------------------------------------------------


def test_parse_accounting_recorded() -> None:
    entries = parse_accounting(RECORDED_SACCT, RECORDED)
    b, a = (f"gp-{TENANT_B}", TENANT_B), (f"gp-{TENANT_A}", TENANT_A)
    assert entries == {
        74: AccountingEntry(74, "RUNNING", 0, 0, utc(2026, 12, 1, 20, 51, 53), utc(2026, 12, 1, 20, 51, 54), None, 11, "vm", None, *b),
        75: AccountingEntry(75, "COMPLETED", 0, 0, utc(2026, 12, 1, 20, 51, 53), utc(2026, 12, 1, 20, 51, 54),
                            utc(2026, 12, 1, 20, 51, 54), 0, "vm", None, *b),
        76: AccountingEntry(76, "FAILED", 3, 0, utc(2026, 12, 1, 20, 51, 53), utc(2026, 12, 1, 20, 51, 54),
                            utc(2026, 12, 1, 20, 51, 54), 0, "vm", None, *a),
        # Held, never ran: no start, and "None assigned" is no node.
        77: AccountingEntry(77, "PENDING", 0, 0, utc(2026, 12, 1, 20, 51, 56), None, None, 0, None, "JobHeldUser", *a),
    }
    assert entries.refused == ()


def test_parse_accounting_exact() -> None:
    entries = parse_accounting(SACCT, RECORDED)
    assert sorted(entries) == [30, 32, 33, 35, 37]  # the array task is no API job
    assert entries[37] == AccountingEntry(
        37, "FAILED", 2, 0, utc(2026, 11, 29, 17, 57, 0), utc(2026, 11, 29, 17, 57, 1), utc(2026, 11, 29, 17, 57, 2), 1, "vm", None, "gp-acme", "acme"
    )
    assert (entries[33].state, entries[33].exit_code, entries[33].exit_signal, entries[33].account) == ("CANCELLED", 0, 9, "acme")
    assert (entries[32].state, entries[32].elapsed_s) == ("TIMEOUT", 3630)
    assert (entries[30].started_at, entries[30].ended_at, entries[30].node, entries[30].reason) == (None, None, None, "Resources")


def test_parse_accounting_keys_on_header_and_refuses_bad_rows_alone() -> None:
    text = (
        "Account|User|Reason|NodeList|ElapsedRaw|End|Start|Submit|ExitCode|State|JobIDRaw\n"
        "acme|gp-acme|None|vm|7|None|Unknown|2026-11-29T17:00:00|1:0|FAILED|9\n"
        "acme|gp-acme|None|vm|7|None|Unknown|2026-11-29T17:00:00|x:y|FAILED|10\n"
        "acme|gp-acme|None|vm|7|None|Unknown|2026-11-29T17:00:00|0:0|COMPLETED|9\n"
        "acme|gp-acme|None|vm|7|None|Unknown|2026-11-29T17:00:00|0:0|COMPLETED|11\n"
    ).replace("|", RECORDED)
    entries = parse_accounting(text, RECORDED)
    assert entries == {11: AccountingEntry(11, "COMPLETED", 0, 0, utc(2026, 11, 29, 17, 0, 0), None, None, 7, "vm", None, "gp-acme", "acme")}
    assert entries.refused == (
        "sacct line 3: not a Slurm exit code: 'x:y'",
        "sacct line 4: job 9 listed again; none of its rows is believed",
    )


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
@pytest.mark.parametrize(
    "parse",
    [parse_delimited, lambda text: parse_queue(text, RECORDED), lambda text: parse_accounting(text, RECORDED), parse_inventory],
    ids=["delimited", "squeue", "sacct", "sinfo"],
)
def test_no_header_line(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(ParseError, match="no header line"):
        parse(text)


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (lambda text: parse_queue(text, RECORDED), RECORDED.join(pending("41", "gpupool:j-41")) + "\n"),
        (lambda text: parse_accounting(text, RECORDED), SACCT.split("\n", 1)[1]),
        (parse_inventory, "vm|gpu:rtx4090:4\n"),
    ],
    ids=["squeue", "sacct", "sinfo"],
)
def test_headerless_output_is_a_parse_error(parse: Callable[[str], object], text: str) -> None:
    # Output without its header row must not be read as "no jobs" / "no GPUs".
    with pytest.raises(ParseError):
        parse(text)


def test_row_with_too_few_fields() -> None:
    with pytest.raises(ParseError, match="line 2: expected 3 fields, got 2"):
        parse_delimited("A|B|C\n1|2\n")


# --- numbered_rows ---------------------------------------------------------------------


def test_numbered_rows_join_lines_only_when_asked() -> None:
    text = "A|B|C\n1|2|x\nmore\n3|4|y\n"
    assert list(numbered_rows(text, "|", 3, multiline_last=True)) == [(2, ["1", "2", "x\nmore"]), (4, ["3", "4", "y"])]
    assert list(numbered_rows(text, "|", 3)) == [(2, ["1", "2", "x"]), (3, ["more"]), (4, ["3", "4", "y"])]


def test_numbered_rows_end_lines_at_newline_alone() -> None:
    text = "A|B\n1|x\u2028y\x1ez\rw\x85v\n"
    assert list(numbered_rows(text, "|", 2)) == [(2, ["1", "x\u2028y\x1ez\rw\x85v"])]


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


# --- whose row is whose: the refresher's side ------------------------------------------


def refresher() -> JobStateRefresher:
    slurm = SlurmClient(Settings(service_user="gpupool", service_group="gpupool"), tenants=object())  # type: ignore[arg-type]
    return JobStateRefresher(None, slurm, interval_s=1, submission_grace_s=60)  # type: ignore[arg-type]


def running_job(account: str, slurm_job_id: int, job_id: str) -> Job:
    started = utc(2026, 12, 1, 20, 51, 54)
    return Job(
        id=job_id, account=account, slurm_job_id=slurm_job_id, state="RUNNING", finished=False, reason=None, node="vm",
        submitted_at=utc(2026, 12, 1, 20, 51, 53), started_at=started, ended_at=None, exit_code=None, exit_signal=None,
        elapsed_s=None, last_seen_at=started, updated_at=started, created_at=started, submit_attempted_at=started,
    )


def test_a_row_counts_only_for_its_jobs_own_account_and_tenant_user() -> None:
    """B's job 74, and rows naming it: squeue's and sacct's from A's tenant, or from B's account as
    another user, change nothing; the row from B's own tenant does."""
    victim = running_job(TENANT_B, 74, "0b7e2d4c-victim")
    now = utc(2026, 12, 1, 20, 52, 0)
    forged = QueueEntry(74, "PENDING", "Forged", utc(2026, 12, 1), None, None, None, "", f"gp-{TENANT_B}", TENANT_B)
    ended = AccountingEntry(74, "COMPLETED", 0, 0, utc(2026, 12, 1), utc(2026, 12, 1), utc(2026, 12, 1), 1, "vm", None)
    for user, account in ((f"gp-{TENANT_A}", TENANT_A), (f"gp-{TENANT_A}", TENANT_B), ("gpupool", TENANT_B), ("root", TENANT_B)):
        queue = {74: replace(forged, user=user, account=account)}
        accounting = {74: replace(ended, user=user, account=account)}
        assert refresher().changes(victim, SlurmAnswers(queue, accounting, {}), now) == {}, (user, account)
    own = SlurmAnswers({74: forged}, {}, {})
    assert refresher().changes(victim, own, now) == {
        "state": "PENDING", "reason": "Forged", "submitted_at": utc(2026, 12, 1), "started_at": None, "node": None,
    }


def test_a_members_job_counts_rows_from_that_members_own_user_alone() -> None:
    """M1's job 75 in account B, run as M1's own user: rows naming it from the account's tenant user or
    from another member's user (M2 forging them from a job of theirs) change nothing; M1's own row does."""
    m1, m2 = f"gp-200101-{TENANT_B}", f"gp-200102-{TENANT_B}"
    job = running_job(TENANT_B, 75, "0b7e2d4c-member")
    job.unix_user = m1
    now = utc(2026, 12, 1, 20, 52, 0)
    row = QueueEntry(75, "PENDING", "Forged", utc(2026, 12, 1), None, None, None, "", m1, TENANT_B)
    ended = AccountingEntry(75, "COMPLETED", 0, 0, utc(2026, 12, 1), utc(2026, 12, 1), utc(2026, 12, 1), 1, "vm", None)
    for user, account in ((m2, TENANT_B), (f"gp-{TENANT_B}", TENANT_B), (m1, TENANT_A)):
        queue = {75: replace(row, user=user, account=account)}
        accounting = {75: replace(ended, user=user, account=account)}
        assert refresher().changes(job, SlurmAnswers(queue, accounting, {}), now) == {}, (user, account)
    assert refresher().changes(job, SlurmAnswers({75: row}, {}, {}), now)["reason"] == "Forged"


def test_a_lost_submission_is_adopted_only_from_the_user_it_was_submitted_as() -> None:
    m1, m2 = f"gp-200101-{TENANT_B}", f"gp-200102-{TENANT_B}"
    job = running_job(TENANT_B, 0, "0b7e2d4c-0000-4000-8000-000000000001")
    job.slurm_job_id, job.state, job.unix_user = None, "SUBMITTING", m1
    tag = f"gpupool:{job.id}"
    now = utc(2026, 12, 1, 20, 52, 0)
    queued = QueueEntry(76, "PENDING", None, utc(2026, 12, 1), None, None, None, tag, m2, TENANT_B)
    # M2 copied M1's tag onto a job of their own: not M1's job.
    assert refresher().changes(job, SlurmAnswers({76: queued}, {}, {(TENANT_B, m2, tag): queued}), now) == {}
    own = replace(queued, user=m1)
    assert refresher().changes(job, SlurmAnswers({76: own}, {}, {(TENANT_B, m1, tag): own}), now)["slurm_job_id"] == 76


def test_another_jobs_tag_in_a_row_makes_it_no_row_of_this_job() -> None:
    victim = running_job(TENANT_B, 74, "0b7e2d4c-victim")
    tagged = QueueEntry(74, "PENDING", "Forged", None, None, None, None, "gpupool:someone-else", f"gp-{TENANT_B}", TENANT_B)
    assert refresher().changes(victim, SlurmAnswers({74: tagged}, {}, {}), utc(2026, 12, 1, 20, 52, 0)) == {}
