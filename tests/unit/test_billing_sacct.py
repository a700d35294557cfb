"""sacct accounting output into job runs, on recorded and literal outputs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from bench.support.metering import parse_runs
from billing.sacct import SACCT_FIELDS, DumpRefused, JobRun, RunReader, Tenancy, detect_delimiter
from gpupool.slurm.parse import ParseError

FIXTURES = Path(__file__).parent / "fixtures" / "sacct"


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


RECORDED_RUNS = [
    JobRun(cluster="gpupool", job_id_raw=10, job_id="10", account="bx", state="COMPLETED", start=utc("2026-11-29T19:19:44"), end=utc("2026-11-29T19:19:47"), elapsed_s=3, gpus={"rtx4090": 2}, name="weird|name\nline2"),
    JobRun(cluster="gpupool", job_id_raw=11, job_id="11", account="bx", state="REQUEUED", start=utc("2026-11-29T19:19:44"), end=utc("2026-11-29T19:20:10"), elapsed_s=26, gpus={"rtx4090": 1}, name="req"),
    JobRun(cluster="gpupool", job_id_raw=13, job_id="12_0", account="bx", state="COMPLETED", start=utc("2026-11-29T19:19:48"), end=utc("2026-11-29T19:19:50"), elapsed_s=2, gpus={"rtx4090": 1}, name="arr"),
    JobRun(cluster="gpupool", job_id_raw=12, job_id="12_1", account="bx", state="COMPLETED", start=utc("2026-11-29T19:19:48"), end=utc("2026-11-29T19:19:50"), elapsed_s=2, gpus={"rtx4090": 1}, name="arr"),
]
NONCE = "|5f2a9c7e01bd|"  # the shape of the billing pass's delimiter (unpredictable_delimiter)


def redelimited(text: str, delimiter: str) -> str:
    """``text`` as sacct prints it with ``--delimiter=<delimiter>``: each row's fields split
    as the header has them (a name keeps its '|'), a name's next line left as it is."""
    width = text.split("\n", 1)[0].count("|") + 1
    lines = []
    for line in text.split("\n"):
        fields = line.split("|", width - 1)
        lines.append(delimiter.join(fields) if len(fields) == width else line)
    return "\n".join(lines)


def test_recorded_requeue_array_and_a_name_with_a_newline_is_refused_under_a_pipe() -> None:
    """Recorded on the local cluster with ``-P``: a 2-GPU job named 'weird|name\\nline2', a requeued
    job (first run REQUEUED, second cancelled before it started) and a 2-task array. Under '|' the
    name's second line cannot be told from a row, so the whole output is refused, naming the line."""
    text = (FIXTURES / "requeue-array-pipe.psv").read_text()
    with pytest.raises(DumpRefused, match=r"^line 3: 1 field\(s\) where there are 12 columns") as refused:
        parse_runs(text)
    assert refused.value.line == 3


def test_the_same_output_under_the_passs_delimiter_bills_each_run() -> None:
    text = redelimited((FIXTURES / "requeue-array-pipe.psv").read_text(), NONCE)
    parsed = parse_runs(text, delimiter=NONCE)
    assert parsed.rows == 5
    assert parsed.runs == RECORDED_RUNS


def test_the_id_scan_reads_the_id_columns_only() -> None:
    """The span and the array ids a pass looks up before it reads the rows: those of the JobIDRaw
    and JobID columns of the recorded output, whatever a name holds after them."""
    text = redelimited((FIXTURES / "requeue-array-pipe.psv").read_text(), NONCE)
    reader = RunReader(text, NONCE)
    assert (reader.job_id_span(), reader.array_job_ids()) == ((10, 13), {12})
    # A name of later columns that look like an array task's id, and a line of its own that looks like a row.
    row = NONCE.join(["c", "57", "57", "mallory", "u", "COMPLETED", "2026-11-01T00:00:00", "2026-11-01T00:00:01",
                      "2026-11-01T00:00:11", "10", "gres/gpu=1", f"77_8{NONCE}9_9{NONCE}\n"])
    reader = RunReader(NONCE.join(SACCT_FIELDS) + "\n" + row + f"x{NONCE}3{NONCE}6_7{NONCE}\n", NONCE)
    assert (reader.job_id_span(), reader.array_job_ids()) == ((3, 57), {6})


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
    text = "JobIDRaw|Account|User|State|Start|ElapsedRaw|AllocTRES\n7|acme|u|COMPLETED|2026-11-01T00:00:00|10|gres/gpu=1\n"
    with pytest.raises(ParseError, match="Cluster"):
        parse_runs(text)
    assert parse_runs(text, default_cluster="east").runs[0].cluster == "east"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("JobIDRaw|Account|State\n1|a|COMPLETED\n", "lacks column"),
        (f"{HEADER}\nc|1|1|a|u|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:00|2026-11-01T00:01:00|1:00|gres/gpu=1|n\n", "ElapsedRaw"),
        ("Cluster|JobIDRaw|JobName|Account|User|State|Start|ElapsedRaw|AllocTRES\n", "JobName must be the last column"),
        (f"{HEADER}|Comment\n", "JobName and Comment must be the last column, and only one such"),
        ("Cluster|JobIDRaw|Account|User|State|Start|ElapsedRaw|WorkDir|AllocTRES\n", "WorkDir must be the last column"),
        ("JobIDRaw|Account|State|Start|ElapsedRaw|AllocTRES\n", r"lacks column\(s\) User"),
        ("", "no header"),
        # The one timestamp rule (slurm_parse.parse_time) holds in the billing hot path too.
        (f"{HEADER}\nc|1|1|a|u|COMPLETED|2026-11-01T00:00:00|2026-11-01 00:00:00|2026-11-01T00:01:00|60|gres/gpu=1|n\n", "not a Slurm timestamp"),
    ],
)
def test_malformed_output_is_refused(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_runs(text)


# --- rows a tenant's text could have made ------------------------------------------------

ALICE, BOB = "alice", "bob"  # gpupool tenant accounts, run as gp-alice and gp-bob
# Two members of alice with users of their own (gpupool.slurm.tenants.member_user_name).
ALICE_M1, ALICE_M2 = "gp-200101-alice", "gp-200102-alice"
TENANTS = Tenancy("gp-", {ALICE: "gp-alice", BOB: "gp-bob"}, {ALICE_M1: ALICE, ALICE_M2: ALICE})


def fields(job: int, account: str, user: str, name: str, *, elapsed: int = 10, gpus: int = 1) -> list[str]:
    return [
        "c", str(job), str(job), account, user, "COMPLETED", "2026-11-01T00:00:00", "2026-11-01T00:00:01",
        "2026-11-01T10:00:01", str(elapsed), f"gres/gpu={gpus}", name,
    ]


def output(*rows: list[str], delimiter: str = NONCE) -> str:
    return "\n".join(delimiter.join(row) for row in (list(SACCT_FIELDS), *rows)) + "\n"


# What a tenant writes after a newline in its job name: a whole row, 40 GPU-hours on bob.
FORGED = "|".join(fields(99, BOB, "gp-bob", "forged", elapsed=36_000, gpus=4))


@pytest.mark.parametrize(
    "name",
    ["a'; echo foo", "a\n0", "x\n" + FORGED, "x\n" + FORGED + "\ny", "x\u2028" + FORGED, "x\r" + FORGED, "tag|with|pipes"],
    ids=["quote", "newline-0", "forged-row", "forged-row-then-more", "u2028", "cr", "pipes"],
)
def test_under_the_passs_delimiter_a_name_is_a_name(name: str) -> None:
    parsed = parse_runs(output(fields(57, ALICE, "gp-alice", name), fields(58, BOB, "gp-bob", "b")), delimiter=NONCE, tenancy=TENANTS)
    assert [(run.job_id_raw, run.account, run.name) for run in parsed.runs] == [(57, ALICE, name), (58, BOB, "b")]


@pytest.mark.parametrize(
    ("name", "line", "reason"),
    [
        # The name's next line is not a whole row: the file is refused, not read as more of the name.
        ("a\n0", 3, "1 field(s) where there are 12 columns"),
        # A whole row billing a tenant: it may be anyone's name.
        ("x\n" + FORGED, 3, "the columns are separated by '|'"),
        ("x\n" + FORGED + "\ny", 3, "the columns are separated by '|'"),
        # The same row billing no tenant still has a line after it that is no row.
        ("x\n" + FORGED.replace("|bob|gp-bob|", "|other|x|") + "\ny", 4, "1 field(s) where there are 12 columns"),
    ],
    ids=["newline-0", "forged-row", "forged-row-then-more", "forged-other-then-more"],
)
def test_under_a_pipe_a_newline_in_a_name_refuses_the_file(name: str, line: int, reason: str) -> None:
    text = output(fields(57, "other", "mallory", name), delimiter="|")
    with pytest.raises(DumpRefused) as refused:
        parse_runs(text, tenancy=TENANTS)
    assert refused.value.line == line and refused.value.reason.startswith(reason), refused.value


def test_under_a_pipe_rows_of_non_tenants_still_bill() -> None:
    """Other sites' accounts (Open XDMoD's exports): no gpupool tenant's money is at stake."""
    text = output(fields(57, "chaff", "noror", "b24c|name"), fields(58, "other", "x", "n"), delimiter="|")
    assert [(run.account, run.name) for run in parse_runs(text, tenancy=TENANTS).runs] == [("chaff", "b24c|name"), ("other", "n")]


def test_under_a_pipe_a_tenants_row_is_refused_even_when_it_is_real() -> None:
    text = output(fields(57, ALICE, "gp-alice", "train"), delimiter="|")
    with pytest.raises(DumpRefused, match="^line 2: the columns are separated by '[|]'.*'alice', a gpupool tenant's"):
        parse_runs(text, tenancy=TENANTS)


@pytest.mark.parametrize(
    ("account", "user", "reason"),
    [
        (BOB, "gp-alice", "account 'bob' runs jobs as 'gp-bob' and its members' own users alone, and this row names user 'gp-alice'"),
        (BOB, "root", "account 'bob' runs jobs as 'gp-bob' and its members' own users alone, and this row names user 'root'"),
        # A member's own user bills their account alone...
        (BOB, ALICE_M1, f"user '{ALICE_M1}' is a member's user of account 'alice', and this row bills account 'bob'"),
        ("other", ALICE_M2, f"user '{ALICE_M2}' is a member's user of account 'alice', and this row bills account 'other'"),
        # ...and one this database did not make is nobody's member of bob.
        (BOB, "gp-200999-bob", "account 'bob' runs jobs as 'gp-bob' and its members' own users alone, and this row names user 'gp-200999-bob'"),
        ("other", "gp-alice", "user 'gp-alice' is the tenant user of account 'alice', and this row bills account 'other'"),
        # A tenant user of an account this database does not know is still that account's alone.
        ("other", "gp-carol", "user 'gp-carol' is the tenant user of account 'carol', and this row bills account 'other'"),
    ],
)
def test_a_row_whose_user_and_account_do_not_go_together(account: str, user: str, reason: str) -> None:
    text = output(fields(57, ALICE, "gp-alice", "mine"), fields(58, account, user, "theirs"), fields(59, BOB, "gp-bob", "b"))
    # A replay refuses the file, naming the line...
    with pytest.raises(DumpRefused) as refused:
        parse_runs(text, delimiter=NONCE, tenancy=TENANTS)
    assert (refused.value.line, refused.value.reason) == (3, reason)
    # ...a pass leaves that row out, says why, and bills the others.
    reader = RunReader(text, NONCE, tenancy=TENANTS, refuse_mismatches=False)
    assert [run.job_id_raw for run in reader.runs()] == [57, 59]
    assert reader.refused == [f"line 3: job '58': {reason}"]


def test_rows_of_an_accounts_members_own_users_bill_that_account() -> None:
    text = output(fields(57, ALICE, ALICE_M1, "m1"), fields(58, ALICE, ALICE_M2, "m2"), fields(59, ALICE, "gp-alice", "old"))
    reader = RunReader(text, NONCE, tenancy=TENANTS, refuse_mismatches=False)
    # Each keeps the member's user that ran it, for that member's monthly spend; the account's own user is no member's.
    assert [(run.job_id_raw, run.account, run.member_user) for run in reader.runs()] == [
        (57, ALICE, ALICE_M1), (58, ALICE, ALICE_M2), (59, ALICE, None),
    ]
    assert reader.refused == []


def test_a_members_user_is_never_read_as_an_accounts_tenant_user() -> None:
    # gp-200101-alice is no account's tenant user: "200101-alice" is no account name.
    assert Tenancy("gp-").mismatch("200101-alice", "gp-200101-alice") is None
    assert Tenancy("gp-").mismatch("other", "gp-200101-alice") is None


def test_a_bad_value_is_refused_with_its_line() -> None:
    bad = fields(58, ALICE, "gp-alice", "x")
    bad[7] = "2026-11-01 00:00:01"
    with pytest.raises(DumpRefused, match="^line 3: not a Slurm timestamp"):
        parse_runs(output(fields(57, ALICE, "gp-alice", "ok"), bad), delimiter=NONCE, tenancy=TENANTS)
