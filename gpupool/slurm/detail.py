"""Running jobs and the GPUs each holds, from ``scontrol show job --details --oneliner``.

Pure functions only, tested on recorded output (``gpupool.slurm.parse`` maps
every parser of Slurm's text). Each job is one line of
``Key=Value`` words; with ``--details`` every allocated node (or group of
identical nodes) adds ``Nodes=<hostlist> CPU_IDs=.. Mem=.. GRES=<detail>``,
where the detail names the GPU indices, e.g. ``gpu:rtx4090:2(IDX:0-1)``
(Slurm 20.11 to 23.11; before that the word was ``GRES_IDX=``).

The job name is free text printed between ``JobName=`` and ``UserId=``, and a
customer chooses it: a name such as ``x Account=other GRES=gpu:4(IDX:0-3)`` must
not pass for allocation words. So the name is taken to run up to the *last*
`` UserId=`` on the line (the fields after the allocation, such as the comment,
the command and the work directory, are gpupool's own for gpupool jobs), and the
allocation is read only from the words between there and ``MinCPUsNode=``,
which Slurm alone writes.

A name, comment, command or work directory may also hold a newline, and with
it a whole forged line that starts ``JobId=<someone else's job>``: it would
pass for that job's record, with GPU indices of the tenant's choosing, and the
idle check would judge (and may cancel) the other job on those GPUs. A job id
printed twice is therefore believed from neither record (``JobRecords.doubted``):
the real record is always there for a job Slurm knows, so a forged one always
makes a second. (The idle check also believes a record only for its own job's
account and tenant user, naming as many GPUs as the job holds:
``gpupool.gpu_usage.idle.record_doubt``.) A record that cannot be read (a
forged line cut short, or the rest of a line a forged one cut off) is skipped
alone, its id still counted for that rule, so no tenant's text stops the
reading of the others'; only when no record at all can be read is the output
taken for a format this parser does not know (ParseError).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import hostlist

from gpupool.slurm.parse import ParseError

_JOB_LINE = re.compile(r"^JobId=\d+ ")
_JOB_ID = re.compile(r"^JobId=(\d+) ")
# The name runs to the last " UserId=": greedy on purpose, see the module docstring.
_NAME_THEN_FIELDS = re.compile(r" JobName=.* (?=UserId=)", re.DOTALL)
_GRES_ITEM = re.compile(
    r"^(?P<name>[^:(]+)(?::(?P<type>[^:(]+))?(?::(?P<count>\d+))?\((?P<kind>IDX|CNT):(?P<spec>[^)]*)\)$"
)
_DETAIL_END = "MinCPUsNode"
_GRES_KEYS = ("GRES", "GRES_IDX")
NO_JOBS = "No jobs in the system"


@dataclass(frozen=True)
class GpusHeldOnNode:
    """The GPU indices one job holds on one node."""

    node: str
    indices: tuple[int, ...]


@dataclass(frozen=True)
class RunningJob:
    """A running job as operators name it (``8_0`` for an array task) and where its GPUs are."""

    slurm_job_id: int
    display_id: str
    account: str
    user: str
    gpus: tuple[GpusHeldOnNode, ...]

    @property
    def gpu_count(self) -> int:
        return sum(len(alloc.indices) for alloc in self.gpus)


def parse_index_list(spec: str) -> tuple[int, ...]:
    """``'0-1,3'`` -> (0, 1, 3): a Slurm bitmap as printed inside ``(IDX:...)``."""
    indices: list[int] = []
    for part in filter(None, spec.split(",")):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ParseError(f"not a GPU index list: {spec!r}")
        indices.extend(range(int(low), int(high or low) + 1))
    return tuple(indices)


def gpu_indices(gres_detail: str) -> tuple[int, ...]:
    """GPU indices in a job's per-node GRES detail, e.g. ``gpu:a:1(IDX:0),gpu:b:1(IDX:3)`` -> (0, 3).

    Other GRES (``shard``, ``mps``...) and counts without indices (``gpu(CNT:2)``)
    add nothing: only an index says which physical GPU a job holds.
    """
    indices: list[int] = []
    for item in filter(None, re.split(r",(?![^(]*\))", gres_detail.strip())):
        match = _GRES_ITEM.match(item.strip())
        if match is None:
            if item.strip() in ("(null)", "N/A"):
                continue
            raise ParseError(f"not a GRES detail: {item!r}")
        if match["name"] != "gpu" or match["kind"] != "IDX" or match["spec"] == "N/A":
            continue
        indices.extend(parse_index_list(match["spec"]))
    return tuple(sorted(set(indices)))


def _key_value_pairs(text: str) -> list[tuple[str, str]]:
    """``Key=Value`` words of ``text`` as pairs, in order; words without ``=`` are skipped."""
    pairs = []
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep:
            pairs.append((key, value))
    return pairs


def _display_id(prefix: dict[str, str], job_id: int) -> str:
    if "ArrayJobId" in prefix and "ArrayTaskId" in prefix:
        return f"{prefix['ArrayJobId']}_{prefix['ArrayTaskId']}"
    if "HetJobId" in prefix and "HetJobOffset" in prefix:
        return f"{prefix['HetJobId']}+{prefix['HetJobOffset']}"
    return str(job_id)


def _expand_nodes(expression: str) -> list[str]:
    try:
        return list(hostlist.expand_hostlist(expression))
    except hostlist.BadHostlist as exc:
        raise ParseError(f"not a Slurm host list: {expression!r}") from exc


def parse_job_line(line: str) -> tuple[str, RunningJob]:
    """One ``--oneliner`` job: its state and what it holds."""
    split = _NAME_THEN_FIELDS.search(line)
    if split is None:
        raise ParseError(f"no JobName/UserId in scontrol line: {line[:120]!r}")
    prefix = dict(_key_value_pairs(line[: split.start()]))
    job_id = int(prefix["JobId"])
    fields: dict[str, str] = {}
    allocations: list[GpusHeldOnNode] = []
    nodes: list[str] = []
    for key, value in _key_value_pairs(line[split.end():]):
        if key == _DETAIL_END:
            break
        if key == "Nodes":
            nodes = _expand_nodes(value)
        elif key in _GRES_KEYS and nodes:
            indices = gpu_indices(value)
            if indices:
                allocations.extend(GpusHeldOnNode(node, indices) for node in nodes)
            nodes = []
        else:
            fields.setdefault(key, value)
    missing = [key for key in ("UserId", "Account", "JobState") if key not in fields]
    if missing:
        raise ParseError(f"scontrol line for job {job_id} lacks {', '.join(missing)}")
    job = RunningJob(
        slurm_job_id=job_id,
        display_id=_display_id(prefix, job_id),
        account=fields["Account"],
        user=fields["UserId"].split("(", 1)[0],
        gpus=tuple(allocations),
    )
    return fields["JobState"], job


@dataclass(frozen=True)
class JobRecords:
    """The RUNNING jobs of one ``scontrol show job`` answer, the job ids it printed more than once, its unreadable records."""

    jobs: list[RunningJob]
    doubted: frozenset[int]
    unreadable: tuple[str, ...] = ()


def parse_running_jobs(text: str) -> list[RunningJob]:
    """Every RUNNING job in ``scontrol show job --details --oneliner`` output, in its order, but doubted ones."""
    return parse_job_records(text).jobs


def parse_job_records(text: str) -> JobRecords:
    """``parse_running_jobs`` with the ids it did not believe (see the module docstring)."""
    if text.strip() == NO_JOBS:
        return JobRecords([], frozenset())
    records: list[str] = []
    for line in text.splitlines():
        if _JOB_LINE.match(line):
            records.append(line)
        elif records:
            # A newline inside a job name (sbatch allows one): the job goes on.
            records[-1] += "\n" + line
        elif line.strip():
            raise ParseError(f"not a --oneliner job line: {line[:120]!r}")
    parsed: list[tuple[str, RunningJob]] = []
    unreadable: list[str] = []
    seen: Counter[int] = Counter()
    for record in records:
        match = _JOB_ID.match(record)
        assert match is not None  # every record starts with _JOB_LINE
        seen[int(match[1])] += 1
        try:
            parsed.append(parse_job_line(record))
        except (ParseError, KeyError, ValueError) as exc:
            unreadable.append(f"{record[:80]!r}: {exc}")
    if records and not parsed:
        raise ParseError(f"no scontrol job line could be read; the first: {unreadable[0]}")
    doubted = frozenset(job_id for job_id, count in seen.items() if count > 1)
    running = [job for state, job in parsed if state == "RUNNING" and job.slurm_job_id not in doubted]
    return JobRecords(running, doubted, tuple(unreadable))
