"""Parsers for Slurm's delimited output, keyed on its header row.

Only pure functions live here, so they are tested on literal strings.
A free-text column (a job name) may itself contain the delimiter or a newline;
callers put at most one such column last, and ``parse_delimited`` keeps the
rest of the line, continuation lines included, in that last column.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

_NO_TIME = frozenset({"", "Unknown", "N/A", "None", "NONE", "(null)"})
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


def iter_rows(text: str, delimiter: str, width: int) -> Iterator[list[str]]:
    """Rows after the header as field lists, lazily; a row is yielded once the next one starts."""
    lines = iter(text.splitlines())
    for line in lines:
        if line.strip():
            break  # the header
    pending: list[str] | None = None
    for line in lines:
        fields = line.split(delimiter, width - 1)
        if len(fields) == width:
            if pending is not None:
                yield pending
            pending = fields
        elif pending is not None and line != "":
            # A newline inside the last (free-text) column of the previous row.
            pending[-1] += "\n" + line
        elif line.strip():
            raise ParseError(f"expected {width} fields, got {len(fields)}: {line!r}")
    if pending is not None:
        yield pending


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
    value = value.strip()
    if value in _NO_TIME:
        return None
    # fromisoformat is an order of magnitude faster than strptime; the shape
    # check keeps it from accepting the other ISO forms Slurm never prints.
    if len(value) != 19 or value[10] != "T":
        raise ParseError(f"not a Slurm timestamp: {value!r}")
    try:
        return dt.datetime.fromisoformat(value + "+00:00")
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
