"""Reading sacct's accounting output into job runs: pure, tested on literal strings.

The worker asks for exactly ``SACCT_FIELDS``; replays accept any
``sacct --parsable2`` output whose header names at least ``REQUIRED_FIELDS``.
``JobName`` is free text, so it must be the last column: a ``|`` in it then
stays in the name, and a newline continues the name on the next line.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpupool.slurm_parse import ParseError, base_state, gpus_by_type, parse_time, split_rows

SACCT_FIELDS = (
    "Cluster",
    "JobIDRaw",
    "JobID",
    "Account",
    "User",
    "State",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "AllocTRES",
    "JobName",
)
REQUIRED_FIELDS = ("JobIDRaw", "Account", "State", "Start", "ElapsedRaw", "AllocTRES")
# States whose runs end with an automatic credit when the operator asks for it.
FAILED_NODE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})
_UNFINISHED = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "STAGE_OUT"})


@dataclass(frozen=True, slots=True)
class JobRun:
    """One allocation of one job: a requeued job has one run per start."""

    cluster: str
    job_id_raw: int
    job_id: str
    account: str
    state: str
    start: dt.datetime
    end: dt.datetime | None
    elapsed_s: int
    gpus: dict[str, int]
    name: str

    @property
    def finished(self) -> bool:
        """Slurm's final word on the run. Until slurmdbd has its end time, ElapsedRaw is "now - start"."""
        return self.end is not None and self.state not in _UNFINISHED


@dataclass(frozen=True, slots=True)
class ParsedAccounting:
    runs: list[JobRun]
    rows: int  # every row read, including pending and GPU-less jobs


def detect_delimiter(header_line: str) -> str:
    """The delimiter of a header line made of known field names, e.g. ``Cluster|JobIDRaw|...``."""
    known = sorted(set(SACCT_FIELDS) | set(REQUIRED_FIELDS) | {"JobIDRaw", "ExitCode", "Elapsed"}, key=len, reverse=True)
    first = next((name for name in known if header_line.startswith(name)), None)
    if first is not None:
        rest = header_line[len(first):]
        positions = [position for name in known if (position := rest.find(name)) > 0]
        if positions:
            return rest[: min(positions)]
    raise ParseError(f"cannot tell the delimiter of header {header_line[:120]!r}")


def parse_runs(text: str, *, delimiter: str = "|", default_cluster: str | None = None) -> ParsedAccounting:
    """Every run with an allocation holding GPUs; pending and never-started jobs bill nothing."""
    header, rows = split_rows(text, delimiter, REQUIRED_FIELDS)
    if header[-1] != "JobName" and "JobName" in header:
        raise ParseError("JobName must be the last column, or a '|' in a name would shift the columns")
    column = {name: index for index, name in enumerate(header)}
    if "Cluster" not in column and default_cluster is None:
        raise ParseError("no Cluster column; name the cluster (--cluster) for this output")
    i_cluster = column.get("Cluster")
    i_raw, i_account, i_state = column["JobIDRaw"], column["Account"], column["State"]
    i_start, i_elapsed, i_tres = column["Start"], column["ElapsedRaw"], column["AllocTRES"]
    i_id, i_end, i_name = column.get("JobID"), column.get("End"), column.get("JobName")

    runs: list[JobRun] = []
    for row in rows:
        raw = row[i_raw].strip()
        if not raw.isdigit():
            continue  # a step (12.batch) of output read without -X
        tres = row[i_tres]
        if "gres/gpu" not in tres:
            continue
        elapsed_text = row[i_elapsed].strip()
        if not elapsed_text.isdigit():
            raise ParseError(f"job {raw}: ElapsedRaw {elapsed_text!r} is not a number of seconds")
        elapsed = int(elapsed_text)
        state = base_state(row[i_state])
        start = parse_time(row[i_start])
        if start is None or state == "PENDING":
            continue  # never allocated: no charge
        # A run with ElapsedRaw 0 bills nothing, but is kept: it may correct seconds
        # billed while slurmdbd still thought it was running.
        gpus = gpus_by_type(tres)
        if not gpus:
            continue
        runs.append(
            JobRun(
                cluster=row[i_cluster].strip() if i_cluster is not None else default_cluster or "",
                job_id_raw=int(raw),
                job_id=row[i_id].strip() if i_id is not None else raw,
                account=row[i_account].strip().lower(),
                state=state,
                start=start,
                end=parse_time(row[i_end]) if i_end is not None else None,
                elapsed_s=elapsed,
                gpus=gpus,
                name=row[i_name] if i_name is not None else "",
            )
        )
    return ParsedAccounting(runs=runs, rows=len(rows))
