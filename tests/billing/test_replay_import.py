"""Historical import: other sites' real sacct dumps replayed through the operator's CLI.

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
from gpupool.models import LedgerEntry
from tests.billing.conftest import LedgerDb
from tests.conftest import REPO

EXTERNAL = REPO.parent / "shared" / "external-data" / "sacct"
XDMOD_LOGS = sorted(EXTERNAL.glob("xdmod_*.log")) if EXTERNAL.is_dir() else []
UNTYPED_NANOS = 90_000  # the '*' price: these sites' GPUs carry no type
pytestmark = pytest.mark.skipif(
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


def test_a_ten_day_xdmod_job_is_split_at_the_month_start(priced: LedgerDb) -> None:
    """phillips.log job 163485: 2 GPUs from 2016-12-22T07:15:13 for 10-13:27:06, across New Year."""
    path = EXTERNAL / "xdmod_phillips.log"
    assert priced.cli("billing", "replay", "--format", "xdmod", str(path)).returncode == 0
    spans = [(row[10], row[13], row[14]) for row in priced.ledger() if row[3] == 163485]
    december = int((dt.datetime(2017, 1, 1, tzinfo=dt.UTC) - dt.datetime(2016, 12, 22, 7, 15, 13, tzinfo=dt.UTC)).total_seconds())
    assert spans == [("2016-12", december, 2 * december), ("2017-01", 912426 - december, 2 * (912426 - december))]


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
