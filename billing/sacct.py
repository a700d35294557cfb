"""Reading sacct's accounting output into job runs: pure, tested on literal strings.

A billing pass asks for exactly ``SACCT_FIELDS``; replays accept any
``sacct --parsable2`` output whose header names at least ``REQUIRED_FIELDS``
and ``ElapsedRaw`` or ``Elapsed``, or header-less output whose fields are named
by the caller (``XDMOD_FIELDS`` for Open XDMoD's export). Field names are
sacct's, in any case. ``JobName`` is free text, so it must be the last column:
a ``|`` in it then stays in the name, and a newline continues the name on the
next line. The field parsers are ``gpupool.slurm_parse``'s, whose docstring
maps every parser of Slurm's text.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpupool.slurm_parse import (
    ParseError,
    base_state,
    gpus_by_type,
    iter_rows,
    parse_elapsed,
    parse_time,
    read_header,
)

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
REQUIRED_FIELDS = ("JobIDRaw", "Account", "State", "Start", "AllocTRES")
# Exact seconds when sacct printed them; otherwise [D-]HH:MM:SS, as older dumps have it.
ELAPSED_FIELDS = ("ElapsedRaw", "Elapsed")
# Open XDMoD's documented shredder export:
# TZ=UTC sacct --allusers --parsable2 --noheader --allocations --duplicates --format <these>
XDMOD_FIELDS = (
    "jobid", "jobidraw", "cluster", "partition", "qos", "account", "group", "gid", "user", "uid",
    "submit", "eligible", "start", "end", "elapsed", "exitcode", "state", "nnodes", "ncpus",
    "reqcpus", "reqmem", "reqtres", "alloctres", "timelimit", "nodelist", "jobname",
)
# sacct's own spelling of the names billing reads; sacct accepts any case in --format.
_CANONICAL = {
    name.lower(): name
    for name in (*SACCT_FIELDS, "Elapsed", "NodeList", "Partition", "Eligible", "ExitCode", "NNodes", "ReqTRES")
}
# States whose runs end with an automatic credit when the operator asks for it.
FAILED_NODE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})
_UNFINISHED = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "STAGE_OUT"})


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs several times more
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
    # sacct's own text of start and end, reused when writing rows (see billing.ledger_writer).
    start_text: str = field(default="", compare=False, repr=False)
    end_text: str = field(default="", compare=False, repr=False)

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
    known = sorted(set(SACCT_FIELDS) | set(REQUIRED_FIELDS) | {"ExitCode", "Elapsed"}, key=len, reverse=True)
    first = next((name for name in known if header_line.startswith(name)), None)
    if first is not None:
        rest = header_line[len(first):]
        positions = [position for name in known if (position := rest.find(name)) > 0]
        if positions:
            return rest[: min(positions)]
    raise ParseError(f"cannot tell the delimiter of header {header_line[:120]!r}")


@dataclass
class RunReader:
    """Runs of one sacct text, read lazily (``runs()``), so a pass can write while it reads.

    ``fields`` names the columns of header-less output (``--noheader``); without
    it the first line is the header. ``rows`` counts every row read so far,
    including pending and GPU-less jobs.
    """

    text: str
    delimiter: str = "|"
    default_cluster: str | None = None
    fields: tuple[str, ...] | None = None
    rows: int = 0

    def __post_init__(self) -> None:
        names = list(self.fields) if self.fields is not None else read_header(self.text, self.delimiter)
        self.header = [_CANONICAL.get(name.strip().lower(), name.strip()) for name in names]
        missing = [name for name in REQUIRED_FIELDS if name not in self.header]
        if not any(name in self.header for name in ELAPSED_FIELDS):
            missing.append("ElapsedRaw (or Elapsed)")
        if missing:
            raise ParseError(f"sacct output lacks column(s) {', '.join(missing)}; columns were {','.join(names)[:300]!r}")
        if self.header[-1] != "JobName" and "JobName" in self.header:
            raise ParseError("JobName must be the last column, or a '|' in a name would shift the columns")
        if "Cluster" not in self.header and self.default_cluster is None:
            raise ParseError("no Cluster column; name the cluster (--cluster) for this output")

    def job_id_span(self) -> tuple[int, int] | None:
        """Lowest and highest JobIDRaw, by a quick scan; name lines can only widen it."""
        index = self.header.index("JobIDRaw")
        delimiter = re.escape(self.delimiter)
        pattern = re.compile(rf"^(?:[^\n]*?{delimiter}){{{index}}}(\d+){delimiter}", re.MULTILINE)
        ids = [int(found) for found in pattern.findall(self.text)]
        return (min(ids), max(ids)) if ids else None

    def runs(self) -> Iterator[JobRun]:
        """Every run that was allocated GPUs; pending and never-started jobs bill nothing."""
        column = {name: index for index, name in enumerate(self.header)}
        i_cluster = column.get("Cluster")
        i_raw, i_account, i_state = column["JobIDRaw"], column["Account"], column["State"]
        i_start, i_tres = column["Start"], column["AllocTRES"]
        exact_elapsed = "ElapsedRaw" in column
        i_elapsed = column["ElapsedRaw" if exact_elapsed else "Elapsed"]
        i_id, i_end, i_name = column.get("JobID"), column.get("End"), column.get("JobName")
        default_cluster = self.default_cluster or ""
        # A cluster has few job shapes and states: the same strings recur thousands of times.
        gpus_of: dict[str, dict[str, int]] = {}
        states: dict[str, str] = {}
        for row in iter_rows(self.text, self.delimiter, len(self.header), has_header=self.fields is None):
            self.rows += 1
            raw = row[i_raw]
            if not raw.isdigit():
                continue  # a step (12.batch) of output read without -X
            tres = row[i_tres]
            if "gres/gpu" not in tres:
                continue
            elapsed_text = row[i_elapsed]
            if elapsed_text.isdigit():
                elapsed_s = int(elapsed_text)
            elif exact_elapsed:
                raise ParseError(f"job {raw}: ElapsedRaw {elapsed_text!r} is not a number of seconds")
            else:
                try:
                    elapsed_s = parse_elapsed(elapsed_text)
                except ParseError as exc:
                    raise ParseError(f"job {raw}: {exc}") from exc
            state = states.get(row[i_state])
            if state is None:
                state = states[row[i_state]] = base_state(row[i_state])
            start_text = row[i_start]
            start = parse_time(start_text)
            if start is None or state == "PENDING":
                continue  # never allocated: no charge
            # A run with ElapsedRaw 0 bills nothing, but is kept: it may correct seconds
            # billed while slurmdbd still thought it was running.
            gpus = gpus_of.get(tres)
            if gpus is None:
                gpus = gpus_of[tres] = gpus_by_type(tres)
            if not gpus:
                continue
            end_text = row[i_end] if i_end is not None else ""
            end = parse_time(end_text)
            yield JobRun(
                row[i_cluster] if i_cluster is not None else default_cluster,
                int(raw),
                row[i_id] if i_id is not None else raw,
                row[i_account].lower(),
                state,
                start,
                end,
                elapsed_s,
                gpus,
                row[i_name].replace("\x00", "") if i_name is not None else "",
                start_text,
                end_text if end is not None else "",
            )


def parse_runs(
    text: str, *, delimiter: str = "|", default_cluster: str | None = None, fields: tuple[str, ...] | None = None
) -> ParsedAccounting:
    """Every run of ``text`` that was allocated GPUs, at once."""
    reader = RunReader(text, delimiter, default_cluster, fields)
    runs = list(reader.runs())
    return ParsedAccounting(runs=runs, rows=reader.rows)
