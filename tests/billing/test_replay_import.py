"""Historical import: other sites' real sacct dumps replayed through the operator's CLI,
and dumps whose job names forge rows, which are refused whole.

The dumps live beside the repository in ``../shared/external-data/sacct/`` (see
its SOURCES.md) and are never copied into it. The expected GPU-seconds are
worked out here from the raw lines, independently of billing.sacct.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from sqlalchemy import func, select

from billing.prices import set_price
from billing.sacct import SACCT_FIELDS
from gpupool.models import Account, BillingPass, LedgerEntry
from tests.billing.conftest import LedgerDb
from tests.conftest import REPO
from tests.support.sacct_dumps import as_pass_output

EXTERNAL = REPO.parent / "shared" / "external-data" / "sacct"
XDMOD_LOGS = sorted(EXTERNAL.glob("xdmod_*.log")) if EXTERNAL.is_dir() else []
UNTYPED_NANOS = 90_000  # the '*' price: these sites' GPUs carry no type
needs_dumps = pytest.mark.skipif(
    not XDMOD_LOGS, reason=f"no XDMoD dumps in {EXTERNAL} (the shared external-data folder is absent)"
)
XDMOD_COLUMNS = (
    "jobid,jobidraw,cluster,partition,qos,account,group,gid,user,uid,submit,eligible,start,end,"
    "elapsed,exitcode,state,nnodes,ncpus,reqcpus,reqmem,reqtres,alloctres,timelimit,nodelist,jobname"
).split(",")


def expected_gpu_seconds(path: Path) -> dict[tuple[int, dt.datetime], int]:
    """Per allocation that ran with GPUs: gpus(AllocTRES) x Elapsed, from the raw lines."""
    expected: dict[tuple[int, dt.datetime], int] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = dict(zip(XDMOD_COLUMNS, line.split("|", len(XDMOD_COLUMNS) - 1), strict=True))
        counts = re.findall(r"(?:^|,)gres/gpu=(\d+)", row["alloctres"])
        if not counts or row["start"] in ("Unknown", "None") or row["state"] == "PENDING":
            continue
        days, _, clock = row["elapsed"].rpartition("-")
        hours, minutes, seconds = (int(part) for part in clock.split(":"))
        elapsed = int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
        start = dt.datetime.fromisoformat(row["start"]).replace(tzinfo=dt.UTC)
        if elapsed:
            expected[(int(row["jobidraw"]), start)] = int(counts[0]) * elapsed
    return expected


def ledger_gpu_seconds(ledger: LedgerDb) -> dict[tuple[int, dt.datetime], int]:
    query = select(LedgerEntry.job_id_raw, LedgerEntry.run_start, func.sum(LedgerEntry.gpu_seconds)).group_by(
        LedgerEntry.job_id_raw, LedgerEntry.run_start
    )
    with ledger.engine.connect() as connection:
        return {(job, start): int(total) for job, start, total in connection.execute(query)}


@pytest.fixture
def priced(ledger_db: LedgerDb) -> LedgerDb:
    with ledger_db.sessions() as session, session.begin():
        set_price(session, "*", UNTYPED_NANOS, dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    return ledger_db


@needs_dumps
def test_every_xdmod_log_replays_to_gpus_times_elapsed_and_a_rerun_adds_nothing(priced: LedgerDb) -> None:
    expected: dict[tuple[int, dt.datetime], int] = {}
    for path in XDMOD_LOGS:
        first = priced.cli("billing", "replay", "--format", "xdmod", str(path))
        assert first.returncode == 0, (path.name, first.stderr)
        assert f"{sum(1 for line in path.read_text().splitlines() if line.strip())} sacct rows" in first.stdout
        expected.update(expected_gpu_seconds(path))
    assert ledger_gpu_seconds(priced) == expected
    assert expected, "the XDMoD dumps hold GPU allocations (phillips.log has two)"
    rows = priced.ledger()
    # Money: every GPU-second at the '*' price, exactly.
    assert sum(row[16] for row in rows) == sum(expected.values()) * UNTYPED_NANOS
    for path in XDMOD_LOGS:
        again = priced.cli("billing", "replay", "--format", "xdmod", str(path))
        assert again.returncode == 0 and " 0 ledger rows" in again.stdout, (path.name, again.stdout, again.stderr)
    assert priced.ledger() == rows


@needs_dumps
def test_a_ten_day_xdmod_job_is_split_at_the_month_start(priced: LedgerDb) -> None:
    """phillips.log job 163485: 2 GPUs from 2016-12-22T07:15:13 for 10-13:27:06, across New Year."""
    path = EXTERNAL / "xdmod_phillips.log"
    assert priced.cli("billing", "replay", "--format", "xdmod", str(path)).returncode == 0
    spans = [(row[10], row[13], row[14]) for row in priced.ledger() if row[3] == 163485]
    december = int((dt.datetime(2017, 1, 1, tzinfo=dt.UTC) - dt.datetime(2016, 12, 22, 7, 15, 13, tzinfo=dt.UTC)).total_seconds())
    assert spans == [("2016-12", december, 2 * december), ("2017-01", 912426 - december, 2 * (912426 - december))]


@needs_dumps
def test_fields_name_any_header_less_dump(priced: LedgerDb, tmp_path: Path) -> None:
    """The same export, its fields spelled out (in sacct's capitals) instead of --format xdmod."""
    path = EXTERNAL / "xdmod_phillips.log"
    fields = ",".join(name.capitalize() for name in XDMOD_COLUMNS)
    result = priced.cli("billing", "replay", "--fields", fields, str(path))
    assert result.returncode == 0, result.stderr
    assert ledger_gpu_seconds(priced) == expected_gpu_seconds(path)
    # The fields decide what a line means: the XDMoD format again finds everything billed.
    again = priced.cli("billing", "replay", "--format", "xdmod", str(path))
    assert again.returncode == 0 and " 0 ledger rows" in again.stdout


@needs_dumps
def test_a_dump_without_what_billing_needs_is_refused_and_says_what_is_missing(priced: LedgerDb) -> None:
    """Hábrók's dump has GPUs but no Account or JobIDRaw column: nothing can be billed to anyone."""
    path = EXTERNAL / "hb-jobinfo_sacct_snowman.txt"
    if not path.exists():
        pytest.skip(f"{path.name} is not in {EXTERNAL}")
    fields = (
        "JobID,JobName,User,Partition,NodeList,NNodes,NCPUs,NTasks,State,Submit,Start,End,Timelimit,Elapsed,"
        "TotalCPU,CPUTime,UserCPU,SystemCPU,ReqMem,MaxRSS,MaxVMSize,ReqTRES,AllocTRES,TRESUsageInMax,"
        "TRESUsageInTot,TRESUsageOutTot,MaxDiskRead,MaxDiskWrite,MaxRSSNode,MaxRSSTask,MaxVMSizeNode,"
        "MaxVMSizeTask,MaxDiskReadNode,MaxDiskReadTask,MaxDiskWriteNode,MaxDiskWriteTask,Comment"
    )
    refused = priced.cli("billing", "replay", "--fields", fields, "--delimiter", "☃", "--cluster", "habrok", str(path))
    assert refused.returncode == 1
    assert "lacks column(s) JobIDRaw, Account" in refused.stderr
    assert priced.ledger() == []
    both = priced.cli("billing", "replay", "--format", "xdmod", "--fields", "a,b", str(path))
    assert both.returncode == 2 and "--format xdmod names the fields itself" in both.stderr


# --- dumps a tenant's job name wrote rows into ------------------------------------------

# Two XDMoD lines of another site's account that bill (2 GPUs each), in Open XDMoD's 26 fields.
FOREIGN_LINES = [
    "196835|196835|phillips|focaccia|chestnut|chaff|chaff|45789|noror|380693|2017-01-01T21:44:50|2017-01-01T21:44:50"
    "|2017-01-01T21:44:50|2017-01-01T21:45:07|00:00:17|0:0|COMPLETED|1|12|12|31000Mn|cpu=12,node=1"
    "|billing=12,cpu=12,gres/gpu=2,mem=31000M,node=1|37-14:00:00|cpn-f11-31|b24c",
    "196836|196836|phillips|focaccia|chestnut|chaff|chaff|45789|noror|380693|2017-01-01T21:44:50|2017-01-01T21:44:50"
    "|2017-01-01T21:44:50|2017-01-01T21:46:07|00:01:17|0:0|COMPLETED|1|12|12|31000Mn|cpu=12,node=1"
    "|billing=12,cpu=12,gres/gpu=2,mem=31000M,node=1|37-14:00:00|cpn-f11-31|b25c",
]


def xdmod_line(job: int, account: str, user: str, hours: int, gpus: int, name: str) -> str:
    return (
        f"{job}|{job}|phillips|focaccia|chestnut|{account}|{account}|45789|{user}|380693|2017-01-02T00:00:00"
        f"|2017-01-02T00:00:00|2017-01-02T00:00:00|2017-01-02T{hours:02d}:00:00|{hours:02d}:00:00|0:0|COMPLETED|1|12|12"
        f"|31000Mn|cpu=12,node=1|billing=12,cpu=12,gres/gpu={gpus},mem=31000M,node=1|37-14:00:00|cpn-f11-31|{name}"
    )


def passes_recorded(ledger: LedgerDb) -> int:
    with ledger.engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(BillingPass)).scalar_one())


@pytest.fixture
def victim(priced: LedgerDb) -> str:
    """A gpupool tenant account of this ledger: its jobs run as gp-victim."""
    with priced.sessions() as session, session.begin():
        session.add(Account(name="victim", gpu_limit=4, unix_user="gp-victim", unix_uid=61_234))
    return "victim"


@pytest.mark.parametrize(
    ("forged", "line", "says"),
    [
        # A whole row after the newline, 40 GPU-hours on the tenant, as its tenant user.
        (xdmod_line(999_001, "victim", "gp-victim", 10, 4, "forged"), 3,
         "the columns are separated by '|', which a tenant's free text can hold, and this row bills account 'victim'"),
        # The same row on another site's account, with the rest of the name after it.
        (xdmod_line(999_002, "chaff", "noror", 10, 4, "forged") + "\nrest of the name", 4,
         "1 field(s) where there are 26 columns"),
    ],
    ids=["whole-row-for-a-tenant", "row-then-more-name"],
)
def test_a_dump_whose_job_name_forges_a_row_is_refused_and_bills_nothing(
    priced: LedgerDb, victim: str, tmp_path: Path, forged: str, line: int, says: str
) -> None:
    good = tmp_path / "good.log"
    good.write_text(FOREIGN_LINES[1] + "\n")
    assert priced.cli("billing", "replay", "--format", "xdmod", str(good)).returncode == 0
    before, passes_before = priced.ledger(), passes_recorded(priced)
    assert before, "the good dump billed something"

    crafted = tmp_path / "crafted.log"
    # The attacker's own job, named "x\n<forged>", between two rows that bill.
    crafted.write_text("\n".join([FOREIGN_LINES[0], xdmod_line(999_000, "chaff", "noror", 1, 1, "x\n" + forged), FOREIGN_LINES[1]]) + "\n")
    refused = priced.cli("billing", "replay", "--format", "xdmod", str(crafted))
    assert refused.returncode == 1, refused.stdout
    assert f"{crafted.resolve()}: line {line}: {says}" in refused.stderr, refused.stderr
    assert priced.ledger() == before  # not the forged run, nor the good rows around it
    assert passes_recorded(priced) == passes_before


def test_a_row_whose_user_is_not_its_accounts_tenant_refuses_the_dump(priced: LedgerDb, victim: str, tmp_path: Path) -> None:
    """Under the pass's own delimiter no name forges a row, but a dump can still be wrong: the
    tenant's row run by another user is refused, naming its line, and nothing is billed."""
    header = "|".join(SACCT_FIELDS)
    rows = [
        "gpupool|501|501|victim|gp-victim|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:00|2026-11-01T01:00:00|3600|gres/gpu=1|mine",
        "gpupool|502|502|victim|gp-mallory|COMPLETED|2026-11-01T00:00:00|2026-11-01T00:00:00|2026-11-01T10:00:00|36000|gres/gpu=4|a'; echo foo",
    ]
    dump = tmp_path / "pass.psv"
    dump.write_text(as_pass_output([header, *rows]))
    refused = priced.cli("billing", "replay", str(dump))
    assert refused.returncode == 1
    assert "line 3: account 'victim' runs jobs as 'gp-victim' and its members' own users alone, and this row names user 'gp-mallory'" in refused.stderr
    assert priced.ledger() == [] and passes_recorded(priced) == 0
    # The tenant's own row alone bills, name and all.
    dump.write_text(as_pass_output([header, rows[0]]))
    assert priced.cli("billing", "replay", str(dump)).returncode == 0
    assert [(row[0], row[3], row[14]) for row in priced.ledger()] == [("victim", 501, 3600)]
