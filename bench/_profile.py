"""Where a submit's CPU and wall time go: per process from /proc, per function group from py-spy.

``CpuMeter`` reads each component's CPU (user + system, from ``/proc/<pid>/stat``)
before and after a timed block and charges the difference to that block's side:
the gunicorn workers, the run-as helper, sbatch (the helper's reaped children, or
the bench's for raw sbatch), slurmctld, munged, PostgreSQL's backends of the bench
database, Redis, and the bench process itself (the client). slurmctld, munged and
Redis serve the whole machine, so a neighbour's work lands in their figures too.

``py_spy`` samples the gunicorn workers and the helper (py-spy record, raw
collapsed stacks) while the bench submits through the API alone, one request at
a time; ``function_groups`` sorts the samples taken inside a request into the
groups below (first match wins) and gives each group's share. With ``--idle``
every sample counts (wall time); without, only those of a thread the kernel
shows running (CPU time). That test cannot tell a thread on a CPU from one
waiting for a CPU, so under load the CPU shares drift towards whatever wakes up
often; one request at a time on 2 cores, that drift is small. py-spy also
slows what it samples, so the bench turns shares into milliseconds with the
figures measured without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_RATE = 200

# A sample belongs to the first group one of whose markers is in one of its frames ("function (file"), outermost first.
WORKER_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sbatch through the run-as helper", ("RunasClient._call (",)),
    ("budget check (lock, balance, prices, queued jobs)", ("_check_budget (",)),
    ("admission (template, account, Idempotency-Key)", ("_admit (",)),
    ("record the Slurm id (one UPDATE, asynchronous commit)", ("_run_sbatch (",)),
    ("the row before sbatch (INSERT, durable COMMIT)", ("Session.commit (",)),
    ("render, build the row", ("submit (api/submission.py",)),
    ("token check", ("authenticate (api/auth.py",)),
    ("rate limit (Redis)", ("flask_limiter/",)),
    ("request body (JSON, pydantic)", ("_submit_body (",)),
    ("response (job view, JSON)", ("submit_job (api/jobs/submitting.py",)),
    ("end of request (session close)", ("close_db_session (",)),
    ("metrics, Server-Timing", ("api/metrics.py",)),
    ("gunicorn, HTTP, Flask", ("handle_request (gunicorn",)),
)
HELPER_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fork and exec sbatch (through setpriv)", ("Popen._execute_child (",)),
    ("wait for sbatch, read its output", ("Popen.communicate (", "Popen.wait (")),
    ("check options and script", ("check_submit_options (", "check_script (", "check_array_values (")),
    ("tenant lookup, job folder", ("_tenant (", "ensure_tenant_folder (")),
    ("write the job's files", ("_write_service_files (", "_write_array_values (")),
    ("read the request, reply", ("_read_request (", "_reply (", "json/")),
    ("accept, hand to a thread", ("process_request (",)),
    ("the rest of the handler", ("_Handler.handle (", "_serve (")),
)
# Frames of a request: outside them a worker (or the helper's accept loop) waits for the next one.
WORKER_BUSY = ("handle_request (gunicorn",)
HELPER_BUSY = ("process_request (", "_serve (")


def _ticks(pid: int) -> tuple[int, int]:
    """(own CPU, reaped children's CPU) of ``pid`` in clock ticks; (0, 0) once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    # Fields 14-17 of proc(5), counted from the state (field 3) after the command name.
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
    return utime + stime, cutime + cstime


def pids_named(command: str) -> list[int]:
    """Processes whose /proc/<pid>/comm is ``command``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == command:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def pids_with_argument(argument: str) -> list[int]:
    """Processes one of whose command-line arguments is ``argument``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argument.encode() in argv:
                found.append(int(entry))
    return found


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@dataclass(frozen=True)
class Component:
    """A part of one side's work: its processes' own CPU, or (``reaped``) that of the children they waited for."""

    name: str
    pids: Callable[[], Sequence[int]]
    reaped: bool = False

    def ticks(self) -> int:
        return sum(_ticks(pid)[1 if self.reaped else 0] for pid in self.pids())


@dataclass
class CpuMeter:
    """CPU seconds of each side's components over the blocks measured for it."""

    components: dict[str, Sequence[Component]]
    spent: dict[str, dict[str, float]] = field(default_factory=dict)

    @contextmanager
    def measure(self, side: str) -> Iterator[None]:
        parts = self.components[side]
        before = [part.ticks() for part in parts]
        yield
        after = [part.ticks() for part in parts]
        spent = self.spent.setdefault(side, {})
        for part, start, end in zip(parts, before, after, strict=True):
            spent[part.name] = spent.get(part.name, 0.0) + (end - start) / CLOCK_TICKS

    def per_job_ms(self, side: str, jobs: int) -> list[tuple[str, float]]:
        return [(part.name, self.spent.get(side, {}).get(part.name, 0.0) * 1000 / jobs) for part in self.components[side]]


def bench_process(reaped: bool) -> Component:
    """This process: the client's CPU, or (``reaped``) that of the sbatch it started and waited for."""
    return Component("sbatch (as the tenant)" if reaped else "the client (bench process)", lambda: [os.getpid()], reaped)


def py_spy_binary() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        sys.exit("--profile needs py-spy: .venv/bin/pip install -e '.[bench]'")
    return found


@contextmanager
def py_spy(pid: int, output: Path, *, idle: bool, subprocesses: bool = False) -> Iterator[None]:
    """py-spy record of ``pid`` (and its children) for as long as the block runs; raw collapsed stacks into ``output``."""
    argv = [py_spy_binary(), "record", "--pid", str(pid), "--rate", str(SAMPLE_RATE), "--format", "raw",
            "--output", str(output), "--nonblocking"]
    argv += ["--idle"] if idle else []
    argv += ["--subprocesses"] if subprocesses else []
    # Stopped with SIGINT, py-spy writes what it has sampled; it starts sampling within a second.
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield
    finally:
        process.send_signal(2)
        _, errors = process.communicate(timeout=60)
        if not output.exists():
            raise RuntimeError(f"py-spy wrote nothing: {errors}")


def _frames(line: str) -> tuple[list[str], int]:
    stack, _, count = line.rstrip("\n").rpartition(" ")
    return [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")], int(count)


def function_groups(output: Path, groups: Sequence[tuple[str, Sequence[str]]], busy: Sequence[str]) -> dict[str, float]:
    """Each group's share of the samples taken inside a request (``busy``); "other" for the rest."""
    spent: Counter[str] = Counter()
    for line in output.read_text().splitlines():
        frames, count = _frames(line)
        if not any(marker in frame for frame in frames for marker in busy):
            continue
        name = next(
            (group for group, markers in groups if any(marker in frame for frame in frames for marker in markers)),
            "other",
        )
        spent[name] += count
    total = sum(spent.values()) or 1
    return {name: spent[name] / total for name in [group for group, _ in groups] + ["other"] if spent[name]}
