"""Reading sacct's accounting output into job runs: pure, tested on literal strings.

The worker asks for exactly ``SACCT_FIELDS``; replays accept any
``sacct --parsable2`` output whose header names at least ``REQUIRED_FIELDS``.
``JobName`` is free text, so it must be the last column: a ``|`` in it then
stays in the name, and a newline continues the name on the next line.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpupool.slurm_parse import ParseError, base_state, gpus_by_type, iter_rows, parse_time, read_header

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
    # sacct's own text of start and end, reused when writing rows (see billing.worker).
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
    known = sorted(set(SACCT_FIELDS) | set(REQUIRED_FIELDS) | {"JobIDRaw", "ExitCode", "Elapsed"}, key=len, reverse=True)
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

    ``rows`` counts every row read so far, including pending and GPU-less jobs.
    """

    text: str
    delimiter: str = "|"
    default_cluster: str | None = None
    rows: int = 0

    def __post_init__(self) -> None:
        self.header = read_header(self.text, self.delimiter, REQUIRED_FIELDS)
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
        i_start, i_elapsed, i_tres = column["Start"], column["ElapsedRaw"], column["AllocTRES"]
        i_id, i_end, i_name = column.get("JobID"), column.get("End"), column.get("JobName")
        default_cluster = self.default_cluster or ""
        # A cluster has few job shapes and states: the same strings recur thousands of times.
        gpus_of: dict[str, dict[str, int]] = {}
        states: dict[str, str] = {}
        from_iso = dt.datetime.fromisoformat
        for row in iter_rows(self.text, self.delimiter, len(self.header)):
            self.rows += 1
            raw = row[i_raw]
            if not raw.isdigit():
                continue  # a step (12.batch) of output read without -X
            tres = row[i_tres]
            if "gres/gpu" not in tres:
                continue
            elapsed_text = row[i_elapsed]
            if not elapsed_text.isdigit():
                raise ParseError(f"job {raw}: ElapsedRaw {elapsed_text!r} is not a number of seconds")
            state = states.get(row[i_state])
            if state is None:
                state = states[row[i_state]] = base_state(row[i_state])
            start_text = row[i_start]
            # Slurm's own shape (2026-11-29T19:19:44, in TZ=UTC) parses on the fast path.
            start = from_iso(start_text + "+00:00") if len(start_text) == 19 else parse_time(start_text)
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
            end = from_iso(end_text + "+00:00") if len(end_text) == 19 else parse_time(end_text)
            yield JobRun(
                row[i_cluster] if i_cluster is not None else default_cluster,
                int(raw),
                row[i_id] if i_id is not None else raw,
                row[i_account].lower(),
                state,
                start,
                end,
                int(elapsed_text),
                gpus,
                row[i_name].replace("\x00", "") if i_name is not None else "",
                start_text,
                end_text if end is not None else "",
            )


def parse_runs(text: str, *, delimiter: str = "|", default_cluster: str | None = None) -> ParsedAccounting:
    """Every run of ``text`` that was allocated GPUs, at once."""
    reader = RunReader(text, delimiter, default_cluster)
    runs = list(reader.runs())
    return ParsedAccounting(runs=runs, rows=reader.rows)
