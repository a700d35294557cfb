"""The pieces of Slurm's text every parser shares, and the map of where each command's output is read.

This module holds the parsers of Slurm's *fields*: delimited rows keyed on
their header (``read_header``, ``iter_rows``, ``parse_delimited``), times,
elapsed times, exit codes, job states, TRES GPU counts, GRES strings and host
lists. Each *command's* output is read next to the format string that asks
for it, so a format and its reader change together:

- ``gpupool.slurm.client``: ``squeue`` and ``sacct`` for job state (``parse_queue``,
  ``parse_accounting``) and ``sinfo`` for the GPU inventory (``parse_inventory``);
- ``gpupool.slurm.detail``: ``scontrol show job --details --oneliner``, the GPU
  indices of running jobs;
- ``gpupool.slurm.report``: ``sinfo --Node``, ``sacct`` allocations, ``sacctmgr``
  events, pending ``squeue`` and ``sreport`` for the operator report;
- ``billing.sacct``: ``sacct`` accounting for billing, read lazily row by row
  (its hot path; it calls the field parsers here).

Only pure functions live in these modules, so they are tested on literal strings.

Text a tenant writes (a job name, a comment) may hold the delimiter and newlines,
and Slurm prints it as it is. So a reader asks for at most one such column, last,
and splits each line into at most the header's number of fields: a delimiter in
the last column stays in it. A newline in it starts a line that is not a row,
and whether that line may be read as more of the last column depends on the
delimiter: with ``|`` a tenant can write a whole row after the newline, so only a
delimiter the tenant could not know when it wrote the text
(``unpredictable_delimiter``, new for each call) lets a reader join lines
(``numbered_rows(..., multiline_last=True)``). Lines end at ``\n`` alone, never
at the other line ends ``str.splitlines`` knows (``\r``, ``\x1e``, ``\u2028``...),
which Slurm prints inside a name as any other character.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

_NO_TIME = frozenset({"", "Unknown", "N/A", "None", "NONE", "(null)"})
_from_iso = dt.datetime.fromisoformat
_TRES_GPU = re.compile(r"^gres/gpu(?::(?P<type>[^=]+))?=(?P<count>\d+)$")


class ParseError(ValueError):
    """Output did not have the shape gpupool asked Slurm for."""


def read_header(text: str, delimiter: str = "|", required: Sequence[str] = ()) -> list[str]:
    """The column names on the first non-blank line of ``text``, which must include ``required``."""
    start = 0
    while True:
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        if line.strip() or end < 0:
            break
        start = end + 1
    if not line.strip():
        raise ParseError("no header line in Slurm output")
    header = [name.strip() for name in line.split(delimiter)]
    missing = [name for name in required if name not in header]
    if missing:
        raise ParseError(f"Slurm output lacks column(s) {', '.join(missing)}; header was {line!r}")
    return header


_UNPREDICTABLE = re.compile(r"\|[0-9a-f]{12}\|")


def unpredictable_delimiter() -> str:
    """A delimiter for one Slurm call: 48 random bits no job name or comment written before it holds."""
    return f"|{secrets.token_hex(6)}|"


def is_unpredictable(delimiter: str) -> bool:
    """Whether ``delimiter`` has the shape of ``unpredictable_delimiter``'s (the billing pass archives its output with it)."""
    return _UNPREDICTABLE.fullmatch(delimiter) is not None


def numbered_rows(
    text: str, delimiter: str, width: int, *, has_header: bool = True, multiline_last: bool = False
) -> Iterator[tuple[int, list[str]]]:
    """Rows of ``text`` as (line number where the row starts, its fields), lazily; blank lines are skipped.

    Each line splits into at most ``width`` fields. With ``multiline_last`` a line of
    fewer continues the last column of the row before it (a newline in the free-text
    column; see the module docstring for when that is safe); otherwise, and before
    any row, such a line is yielded as it is, short, for the caller to refuse or skip.
    """
    lines = text.split("\n")
    first = 0  # index of the first line after the header
    if has_header:
        first = next((index + 1 for index, line in enumerate(lines) if line.strip()), len(lines))
    pending: tuple[int, list[str]] | None = None
    for number, line in enumerate(islice(lines, first, None), first + 1):
        fields = line.split(delimiter, width - 1)
        if len(fields) == width:
            if pending is not None:
                yield pending
            pending = (number, fields)
        elif multiline_last and pending is not None:
            if line:  # the end of the text, or a blank line in a name
                pending[1][-1] += "\n" + line
        elif line.strip():
            if pending is not None:
                yield pending
                pending = None
            yield number, fields
    if pending is not None:
        yield pending


def iter_rows(text: str, delimiter: str, width: int, *, has_header: bool = True) -> Iterator[list[str]]:
    """Rows after the header (every row when ``has_header`` is false) as field lists, lazily.

    A line of fewer than ``width`` fields continues the row before it, so this is for
    output whose only free-text column is last and whose other values never hold a
    newline (``sinfo``, ``sacctmgr``); a short line before any row is a ParseError.
    """
    for number, fields in numbered_rows(text, delimiter, width, has_header=has_header, multiline_last=True):
        if len(fields) != width:
            raise ParseError(f"line {number}: expected {width} fields, got {len(fields)}: {delimiter.join(fields)[:200]!r}")
        yield fields


def split_rows(text: str, delimiter: str = "|", required: Sequence[str] = ()) -> tuple[list[str], list[list[str]]]:
    """The header of ``text`` and its rows as field lists; the header must name ``required``."""
    header = read_header(text, delimiter, required)
    return header, list(iter_rows(text, delimiter, len(header)))


def parse_delimited(text: str, delimiter: str = "|", required: Sequence[str] = ()) -> list[dict[str, str]]:
    """Rows of ``text`` as dicts keyed on its first (header) line, which must name ``required``."""
    header, rows = split_rows(text, delimiter, required)
    return [dict(zip(header, row, strict=True)) for row in rows]


def parse_time(value: str) -> dt.datetime | None:
    """A Slurm timestamp printed under TZ=UTC, or None for Slurm's many spellings of 'none'."""
    # Slurm's own shape (2026-11-29T19:19:44) is tested first and needs no strip:
    # billing reads two timestamps per sacct row.
    if len(value) != 19:
        value = value.strip()
        if value in _NO_TIME:
            return None
    # fromisoformat is an order of magnitude faster than strptime; the shape
    # check keeps it from accepting the other ISO forms Slurm never prints.
    if len(value) != 19 or value[10] != "T":
        raise ParseError(f"not a Slurm timestamp: {value!r}")
    try:
        return _from_iso(value + "+00:00")
    except ValueError as exc:
        raise ParseError(f"not a Slurm timestamp: {value!r}") from exc


def parse_exit_code(value: str) -> tuple[int | None, int | None]:
    """``'2:0'`` -> (2, 0): the exit status and the signal that ended the job."""
    value = value.strip()
    if not value:
        return None, None
    status, _, signal = value.partition(":")
    try:
        return int(status), int(signal or 0)
    except ValueError as exc:
        raise ParseError(f"not a Slurm exit code: {value!r}") from exc


def base_state(value: str) -> str:
    """``'CANCELLED by 0'`` -> ``'CANCELLED'``; squeue and sacct otherwise agree."""
    return value.strip().split(" ", 1)[0].rstrip("+")


_ELAPSED = re.compile(r"^(?:(\d+)-)?(\d+):([0-5]\d):([0-5]\d)$")


def parse_elapsed(value: str) -> int:
    """Slurm's ``Elapsed`` (``[D-]HH:MM:SS``, e.g. ``1-02:03:04``) in seconds."""
    match = _ELAPSED.match(value.strip())
    if match is None:
        raise ParseError(f"not a Slurm elapsed time [D-]HH:MM:SS: {value!r}")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


_HOST_RANGE = re.compile(r"\[([^\]]*)\]")


def expand_hostlist(value: str) -> list[str]:
    """``cpn-f13-03-[01-02],d13n[03,05]`` -> every host name, in order; zero padding kept.

    Slurm compresses one bracket per name in the lists sacct and squeue print;
    names with several brackets expand as their product.
    """
    value = value.strip()
    if value in ("", "None assigned", "(null)", "None"):
        return []
    hosts: list[str] = []
    for name in re.split(r",(?![^\[]*\])", value):
        match = _HOST_RANGE.search(name)
        if match is None:
            hosts.append(name)
            continue
        head, tail = name[: match.start()], name[match.end():]
        for piece in match.group(1).split(","):
            low, _, high = piece.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise ParseError(f"not a Slurm host list: {value!r}")
            for number in range(int(low), int(high or low) + 1):
                hosts.extend(expand_hostlist(f"{head}{number:0{len(low)}d}{tail}"))
    return hosts


def parse_int(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() else None


UNTYPED_GPU = "untyped"


def gpus_by_type(tres: str) -> dict[str, int]:
    """GPU counts per type from a TRES string such as ``cpu=1,gres/gpu:rtx4090=2,gres/gpu=2``.

    Slurm records the untyped key ``gres/gpu`` and each typed key for the same
    GPUs, so they are never added together: typed keys give the split, and only
    GPUs the untyped count has beyond them are reported as ``UNTYPED_GPU``.
    """
    untyped = 0
    typed: dict[str, int] = {}
    for item in tres.split(","):
        if not item.startswith("gres/gpu"):
            continue
        match = _TRES_GPU.match(item.strip())
        if not match:
            continue
        count = int(match["count"])
        if match["type"]:
            typed[match["type"]] = typed.get(match["type"], 0) + count
        else:
            untyped = count
    extra = untyped - sum(typed.values())
    if extra > 0:
        typed[UNTYPED_GPU] = extra
    return {gpu_type: count for gpu_type, count in typed.items() if count > 0}


@dataclass(frozen=True)
class GresEntry:
    name: str
    gpu_type: str | None
    count: int


def parse_gres(value: str) -> list[GresEntry]:
    """``gpu:rtx4090:4(S:0-1),gpu:rtx3090:2`` -> entries (socket bindings ignored)."""
    entries: list[GresEntry] = []
    for item in filter(None, re.split(r",(?![^(]*\))", value.strip())):
        item = re.sub(r"\(.*\)$", "", item.strip())
        if item in ("(null)", ""):
            continue
        parts = item.split(":")
        if len(parts) == 3 and parts[2].isdigit():
            entries.append(GresEntry(parts[0], parts[1], int(parts[2])))
        elif len(parts) == 2 and parts[1].isdigit():
            entries.append(GresEntry(parts[0], None, int(parts[1])))
        elif len(parts) == 2:
            entries.append(GresEntry(parts[0], parts[1], 1))
        elif len(parts) == 1:
            entries.append(GresEntry(parts[0], None, 1))
    return entries


# Slurm's job-id grammar as squeue's %i and sacct's JobID print it: a plain job (123), an
# array task (123_4), an array's tasks still pending as one record (123_[5-19%2], with
# commas between ranges), or a het-job component (123+0), which gpupool never submits.
_PLAIN_JOB_ID = re.compile(r"^[0-9]+$")
_ARRAY_TASK = re.compile(r"([0-9]+)_([0-9]+)")
_ARRAY_PENDING = re.compile(r"^([0-9]+)_\[([0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*)(?:%[0-9]+)?\]$")
# More indices than this in one pending record is no array gpupool submitted (max_array_tasks is at most 100000).
_MAX_ARRAY_INDICES = 100_000


@dataclass(frozen=True)
class ArrayJobId:
    """An array's base job id and the task indices one row stands for (one, or a pending record's many)."""

    array_job_id: int
    tasks: tuple[int, ...]
    # The array's one record of its tasks not yet started (123_[5-19]), not a task's own row.
    pending_record: bool = False


def parse_array_job_id(value: str) -> ArrayJobId | None:
    """``'123_4'`` -> (123, (4,)); ``'123_[5-7,9%2]'`` -> (123, (5, 6, 7, 9)); None for a job that is no array task.

    A ParseError for text of neither shape (a truncated ``123_[5-...``), which
    no caller may read as some other job.
    """
    value = value.strip()
    if _PLAIN_JOB_ID.match(value) or re.fullmatch(r"[0-9]+\+[0-9]+", value):
        return None
    task = _ARRAY_TASK.fullmatch(value)
    if task is not None:
        return ArrayJobId(int(task.group(1)), (int(task.group(2)),))
    pending = _ARRAY_PENDING.match(value)
    if pending is None:
        raise ParseError(f"not a Slurm job id: {value!r}")
    indices: list[int] = []
    for piece in pending.group(2).split(","):
        low, _, high = piece.partition("-")
        first, last = int(low), int(high or low)
        if last < first or len(indices) + last - first + 1 > _MAX_ARRAY_INDICES:
            raise ParseError(f"not an array gpupool submits: {value!r}")
        indices.extend(range(first, last + 1))
    return ArrayJobId(int(pending.group(1)), tuple(indices), pending_record=True)
