"""The Slurm client: every Slurm command gpupool runs, through ``gpupool.proc``.

One instance is built per process and handed to ``create_app`` (or the CLI),
so tests and benchmarks can give it another ``bin_dir`` (for example a folder
of wrappers that count calls) without patching anything. The readers of the
job-state ``squeue``/``sacct`` and inventory ``sinfo`` formats sit below, beside
their format strings; ``gpupool.slurm.parse`` maps every other parser of Slurm's text.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gpupool.cluster_status import Controller, StatusParseError, parse_scontrol_ping
from gpupool.config import Settings
from gpupool.errors import CommandFailed, NotFound, SlurmRejected, SlurmUnavailable, SubmissionUncertain
from gpupool.metrics import observe_slurm_commands
from gpupool.proc import CommandResult, Runner, minimal_env, run_command
from gpupool.render import SPOT_QOS
from gpupool.slurm.detail import RunningJob, parse_job_records
from gpupool.slurm.parse import (
    ParseError,
    base_state,
    is_unpredictable,
    numbered_rows,
    parse_array_job_id,
    parse_delimited,
    parse_exit_code,
    parse_gres,
    parse_int,
    parse_time,
    read_header,
    unpredictable_delimiter,
)
from gpupool.slurm.report import (
    ALLOCATION_FIELDS,
    EVENT_FIELDS,
    NODE_FORMAT,
    PENDING_FORMAT,
    Allocation,
    NodeEvent,
    NodeGpuCapacity,
    NodeReason,
    NodeStatus,
    PendingJob,
    parse_allocations,
    parse_node_events,
    parse_node_gpus,
    parse_node_reasons,
    parse_node_status,
    parse_pending,
)
from gpupool.slurm.runas.actions import TenantActions, tenant_actions
from gpupool.slurm.runas.engine import BUDGET_TRES
from gpupool.slurm.runas.request import Sbatch

T = TypeVar("T")
log = logging.getLogger("gpupool.slurm")

# sbatch's words for a failure after its request may have reached slurmctld, which may
# then hold the job: every failure to send or to receive in slurm_send_recv_controller_msg
# (Slurm's src/common/slurm_protocol_api.c), where only the connect comes before the request.
_MAYBE_SUBMITTED_MARKERS = (
    "Socket timed out",  # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT, on send or on receive
    "Zero Bytes were transmitted",  # SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT
    "(send failure)",  # SLURMCTLD_COMMUNICATIONS_SEND_ERROR
    "(receive failure)",  # SLURMCTLD_COMMUNICATIONS_RECEIVE_ERROR
    "(shutdown failure)",  # SLURMCTLD_COMMUNICATIONS_SHUTDOWN_ERROR: after the reply
    "Transport endpoint",
    "Connection reset",
    "Broken pipe",
    "Insane message length",
    "Incomplete packet",
)
# sbatch's words for "nothing was submitted, try later": the connect failed before any request
# was sent, or slurmctld itself answered that it cannot take jobs now. Checked after the above:
# a refused connect to one controller may be followed by a timeout on its backup.
_NOT_SUBMITTED_MARKERS = (
    "Unable to contact slurm controller",  # "(connect failure)": SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR
    "Connection refused",
    "Slurm temporarily unable",
    "Resource temporarily unavailable",
)
# sbatch --test-only's one line on success (slurm_job_will_run, src/api/job_info.c): only the time is read.
_WILL_RUN = re.compile(r"^sbatch: Job \d+ to start at (?P<start>\S+) using \d+ processors on nodes ", re.MULTILINE)
# The job-state squeue: its one free-text column, the comment (%k), last; see SlurmClient.queue.
_QUEUE_FIELDS = ("%i", "%T", "%r", "%V", "%S", "%e", "%N", "%u", "%a", "%k")


def queue_format(delimiter: str) -> str:
    """The job-state squeue's ``--format`` with ``delimiter`` between the fields."""
    return delimiter.join(_QUEUE_FIELDS)


# With "|", for comparing the cost of the bare command (bench/scale); the service never reads it.
_QUEUE_FORMAT = queue_format("|")
# No free-text column at all: the job name and comment are not asked for.
# JobID names an array task (123_4) beside its own JobIDRaw.
_ACCT_FIELDS = "JobIDRaw,JobID,State,ExitCode,Submit,Start,End,ElapsedRaw,NodeList,Reason,User,Account"


@dataclass(frozen=True)
class QueueEntry:
    """One job as squeue sees it."""

    slurm_job_id: int
    state: str
    reason: str | None
    submitted_at: dt.datetime | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    node: str | None
    comment: str
    user: str = ""
    account: str = ""
    # A pending job's START_TIME: when the scheduler (backfill, usually) expects to start it; None: no estimate yet.
    expected_start: dt.datetime | None = None
    # An array task's index; then slurm_job_id is the array's id (squeue does not print the task's own).
    array_task: int | None = None


@dataclass(frozen=True)
class AccountingEntry:
    """One job allocation as sacct records it."""

    slurm_job_id: int
    state: str
    exit_code: int | None
    exit_signal: int | None
    submitted_at: dt.datetime | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    elapsed_s: int | None
    node: str | None
    reason: str | None
    user: str = ""
    account: str = ""
    # An array task's array id and index; slurm_job_id stays the task's own JobIDRaw.
    array_job_id: int | None = None
    array_task: int | None = None


E = TypeVar("E", QueueEntry, AccountingEntry)


@dataclass(frozen=True, eq=False)  # compared as the mapping it is
class JobRows(Mapping[int, E]):
    """Entries by Slurm job id, and what was left out of them and why (one sentence per line refused).

    A job id listed twice is left out altogether: whichever row came last
    would otherwise win, and the order of rows is no proof of which is Slurm's.
    """

    entries: dict[int, E]
    refused: tuple[str, ...] = ()
    # Array tasks, by array job id and task index: never among ``entries``, which are single jobs.
    tasks: dict[int, dict[int, E]] = field(default_factory=dict)

    def __getitem__(self, slurm_job_id: int) -> E:
        return self.entries[slurm_job_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


@dataclass(frozen=True)
class GpuShare:
    """One GPU's part of its node: the node's CPUs and memory (MB, as Slurm counts) divided by its GPUs."""

    cpus: int
    mem_mb: int

    def smaller(self, other: GpuShare | None) -> GpuShare:
        if other is None:
            return self
        return GpuShare(min(self.cpus, other.cpus), min(self.mem_mb, other.mem_mb))


@dataclass(frozen=True)
class GpuInventory:
    """Largest GPU count on any one node, overall and per type; the smallest per-GPU share, likewise.

    The smallest share, because a job at any larger one would, on the smallest
    node, take CPUs or memory another GPU there needs. None: sinfo gave no sizes.
    """

    max_per_node: int
    max_per_node_by_type: dict[str, int]
    share: GpuShare | None = None
    share_by_type: dict[str, GpuShare] = field(default_factory=dict)


def _none_if_blank(value: str) -> str | None:
    value = value.strip()
    # sacct says "None assigned" for a job that never got a node.
    return None if value in ("", "None", "None assigned", "(null)", "N/A") else value


_QUEUE_COLUMNS = (
    "JOBID", "STATE", "REASON", "SUBMIT_TIME", "START_TIME", "END_TIME", "NODELIST", "USER", "ACCOUNT", "COMMENT",
)
# JobID is read when present: output of the older format (no JobID) names no array task.
_ACCT_COLUMNS = tuple(name for name in _ACCT_FIELDS.split(",") if name != "JobID")


def _job_rows(
    what: str,
    text: str,
    delimiter: str,
    columns: Sequence[str],
    entry_of: Callable[[dict[str, str]], E | list[E] | None],  # a list: an array's pending record
    *,
    free_text: str | None = None,
) -> JobRows[E]:
    """Each row of ``text`` made an entry by ``entry_of`` (None: not an API job; a list: array tasks).

    A row that is not whole or does not parse is refused alone, with its line
    number: one tenant's odd row must not stop every account's refresh. The
    ``free_text`` column must be last, and may span lines only under an
    unpredictable delimiter.
    """
    header = read_header(text, delimiter, required=columns)
    if free_text is not None and header[-1] != free_text:
        raise ParseError(
            f"{what}: {free_text} must be the last column, the only one free text may fill; header was {delimiter.join(header)!r}"
        )
    multiline_last = free_text is not None and is_unpredictable(delimiter)
    entries: dict[int, E] = {}
    repeated: set[int] = set()
    refused: list[str] = []
    tasks: dict[int, dict[int, E]] = {}
    repeated_tasks: set[tuple[int, int]] = set()
    ranged: set[tuple[int, int]] = set()
    for line, fields in numbered_rows(text, delimiter, len(header), multiline_last=multiline_last):
        if len(fields) != len(header):
            refused.append(f"{what} line {line}: {len(fields)} field(s) where the header names {len(header)}")
            continue
        try:
            entry = entry_of(dict(zip(header, fields, strict=True)))
        except ParseError as exc:
            refused.append(f"{what} line {line}: {exc}")
            continue
        if entry is None:
            continue
        if isinstance(entry, list) or entry.array_task is not None:
            # A task's own row (123_4) outranks the array's record of its pending tasks (123_[4-9]),
            # which slurmdbd updates later than it splits tasks off: sacct may show a task in both.
            from_range = isinstance(entry, list)
            for task in entry if isinstance(entry, list) else [entry]:
                array_id = task.slurm_job_id if isinstance(task, QueueEntry) else task.array_job_id
                assert array_id is not None and task.array_task is not None
                key = (array_id, task.array_task)
                of_array = tasks.setdefault(array_id, {})
                if key in repeated_tasks:
                    continue
                if task.array_task in of_array:
                    if from_range and key not in ranged:
                        continue  # its own row came first
                    if not from_range and key in ranged:
                        ranged.discard(key)
                        of_array[task.array_task] = task
                        continue
                    repeated_tasks.add(key)
                    of_array.pop(task.array_task, None)
                    refused.append(f"{what} line {line}: task {array_id}_{task.array_task} listed again; none of its rows is believed")
                    continue
                of_array[task.array_task] = task
                if from_range:
                    ranged.add(key)
            continue
        job_id = entry.slurm_job_id
        if job_id in entries or job_id in repeated:
            repeated.add(job_id)
            entries.pop(job_id, None)
            refused.append(f"{what} line {line}: job {job_id} listed again; none of its rows is believed")
            continue
        entries[job_id] = entry
    return JobRows(entries, tuple(refused), tasks)


def _queue_entry(row: dict[str, str]) -> QueueEntry | list[QueueEntry] | None:
    """A job's entry, an array task's (``array_task`` set), or a pending record's tasks (a list)."""
    array = parse_array_job_id(row["JOBID"])
    job_id = parse_int(row["JOBID"]) if array is None else array.array_job_id
    if job_id is None:  # a het-job component is no API job
        return None
    state = base_state(row["STATE"])
    comment = row["COMMENT"].strip()
    start = parse_time(row["START_TIME"])
    entry = QueueEntry(
        slurm_job_id=job_id,
        state=state,
        reason=_none_if_blank(row["REASON"]),
        submitted_at=parse_time(row["SUBMIT_TIME"]),
        started_at=start if state != "PENDING" else None,
        ended_at=parse_time(row["END_TIME"]) if state not in ("PENDING", "RUNNING") else None,
        node=_none_if_blank(row["NODELIST"]),
        comment="" if comment == "(null)" else comment,  # squeue's word for "no comment"
        user=row["USER"].strip(),
        account=row["ACCOUNT"].strip().lower(),
        expected_start=start if state == "PENDING" else None,
    )
    if array is None:
        return entry
    if array.pending_record:
        return [dataclasses.replace(entry, array_task=task) for task in array.tasks]
    return dataclasses.replace(entry, array_task=array.tasks[0])


def parse_queue(text: str, delimiter: str) -> JobRows[QueueEntry]:
    """The job-state squeue (``queue_format(delimiter)``): header-keyed, the comment last."""
    return _job_rows("squeue", text, delimiter, _QUEUE_COLUMNS, _queue_entry, free_text="COMMENT")


def _accounting_entry(row: dict[str, str]) -> AccountingEntry | list[AccountingEntry] | None:
    job_id = parse_int(row["JobIDRaw"])
    if job_id is None:
        return None
    # Output without JobID (an older format) names no array task: every row is a job of its own.
    array = parse_array_job_id(row["JobID"]) if "JobID" in row else None
    exit_code, exit_signal = parse_exit_code(row["ExitCode"])
    entry = AccountingEntry(
        slurm_job_id=job_id,
        state=base_state(row["State"]),
        exit_code=exit_code,
        exit_signal=exit_signal,
        submitted_at=parse_time(row["Submit"]),
        started_at=parse_time(row["Start"]),
        ended_at=parse_time(row["End"]),
        elapsed_s=parse_int(row["ElapsedRaw"]),
        node=_none_if_blank(row["NodeList"]),
        reason=_none_if_blank(row["Reason"]),
        user=row["User"].strip(),
        account=row["Account"].strip().lower(),
    )
    if array is None:
        return entry
    if array.pending_record:
        return [dataclasses.replace(entry, array_job_id=array.array_job_id, array_task=task) for task in array.tasks]
    return dataclasses.replace(entry, array_job_id=array.array_job_id, array_task=array.tasks[0])


def parse_accounting(text: str, delimiter: str) -> JobRows[AccountingEntry]:
    """The job-state sacct (``--parsable2 --delimiter=<delimiter> --format=<_ACCT_FIELDS>``), header-keyed."""
    return _job_rows("sacct", text, delimiter, _ACCT_COLUMNS, _accounting_entry)


def parse_will_run(text: str) -> dt.datetime | None:
    """When ``sbatch --test-only`` (run under TZ=UTC) says the job would start; None when it names no time."""
    match = _WILL_RUN.search(text)
    return None if match is None else parse_time(match["start"])


def parse_inventory(text: str) -> GpuInventory:
    best = 0
    by_type: dict[str, int] = {}
    share: GpuShare | None = None
    share_by_type: dict[str, GpuShare] = {}
    for row in parse_delimited(text, required=("NODELIST", "GRES")):
        node_total = 0
        node_types: set[str] = set()
        for gres in parse_gres(row["GRES"]):
            if gres.name != "gpu":
                continue
            node_total += gres.count
            if gres.gpu_type:
                by_type[gres.gpu_type] = max(by_type.get(gres.gpu_type, 0), gres.count)
                node_types.add(gres.gpu_type)
        best = max(best, node_total)
        cpus, mem_mb = parse_int(row.get("CPUS", "")), parse_int(row.get("MEMORY", ""))
        if node_total and cpus is not None and mem_mb is not None:
            node_share = GpuShare(cpus // node_total, mem_mb // node_total)
            share = node_share.smaller(share)
            for gpu_type in node_types:
                share_by_type[gpu_type] = node_share.smaller(share_by_type.get(gpu_type))
    return GpuInventory(best, by_type, share, share_by_type)


def _tres_value(tres: str, name: str) -> str | None:
    """The value of ``name`` in a TRES list such as ``cpu=4,gres/gpu=2`` (sacctmgr's GrpTRES); None when absent."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == name:
            return value
    return None


def _log_refused(refused: Sequence[str]) -> None:
    for reason in refused:
        log.warning("%s; the rest of the answer still counts", reason)


class SlurmClient:
    """Queries run as the service itself; submitting and cancelling run as the job's tenant."""

    def __init__(self, settings: Settings, runner: Runner = run_command, tenants: TenantActions | None = None) -> None:
        self.settings = settings
        self._run = observe_slurm_commands(runner)
        self.tenants = tenants or tenant_actions(settings)

    def _as_tenant(self, command: str, action: Callable[[], CommandResult]) -> CommandResult:
        """``action`` timed and counted like any Slurm command the service runs itself."""
        return observe_slurm_commands(lambda _argv, **_kwargs: action())([command])

    # -- plumbing -----------------------------------------------------------------

    @staticmethod
    def _parsed(what: str, parse: Callable[[str], T], text: str) -> T:
        """``parse(text)``, or SlurmUnavailable naming the command: an answer gpupool cannot read is no answer."""
        try:
            return parse(text)
        except (ParseError, KeyError, ValueError) as exc:
            raise SlurmUnavailable(f"unexpected {what} output: {exc}") from exc

    def _command(
        self,
        name: str,
        args: Sequence[str],
        *,
        timeout_s: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        return self._run(
            [self.settings.slurm_bin(name), *args],
            timeout_s=timeout_s or self.settings.slurm_query_timeout_s,
            env=minimal_env(env),
            check=check,
        )

    # -- jobs ---------------------------------------------------------------------

    def submit(self, sbatch: Sbatch) -> int:
        """Submit a rendered script as the account's tenant (or its member user ``user``); options on the command line override its directives."""
        timeout_s = self.settings.slurm_submit_timeout_s
        try:
            result = self._as_tenant("sbatch", lambda: self.tenants.submit(sbatch, timeout_s=timeout_s))
        except CommandFailed as exc:
            # Killed by a signal, sbatch may have been anywhere, waiting for the reply included.
            if exc.returncode < 0 or any(marker in exc.stderr for marker in _MAYBE_SUBMITTED_MARKERS):
                raise SubmissionUncertain(
                    f"sbatch failed after its request may have reached slurmctld: {exc.stderr.strip() or exc.message}",
                    stderr=exc.stderr,
                ) from exc
            if any(marker in exc.stderr for marker in _NOT_SUBMITTED_MARKERS):
                raise
            raise SlurmRejected(
                f"Slurm refused the job: {exc.stderr.strip() or 'sbatch failed'}",
                stderr=exc.stderr,
            ) from exc
        slurm_job_id = parse_int(result.stdout.strip().split(";", 1)[0])
        if slurm_job_id is None:
            raise SlurmUnavailable(f"sbatch printed no job id: {result.stdout!r}")
        return slurm_job_id

    def test_submit(self, sbatch: Sbatch) -> dt.datetime | None:
        """Slurm's estimate of when this job would start (``sbatch --test-only`` as the tenant); nothing is submitted.

        Slurm's refusal is the one a real sbatch of the same job would get, so it is
        raised as that would be: SlurmRejected, or SlurmUnavailable when Slurm is away.
        """
        timeout_s = self.settings.slurm_submit_timeout_s
        try:
            # Apart in the metrics: a quote Slurm refuses is no failed submission.
            result = self._as_tenant("sbatch --test-only", lambda: self.tenants.test_submit(sbatch, timeout_s=timeout_s))
        except CommandFailed as exc:
            if exc.returncode < 0 or any(
                marker in exc.stderr for marker in (*_NOT_SUBMITTED_MARKERS, *_MAYBE_SUBMITTED_MARKERS)
            ):
                raise SlurmUnavailable(f"Slurm could not estimate the job: {exc.stderr.strip() or exc.message}") from exc
            raise SlurmRejected(f"Slurm refused the job: {exc.stderr.strip() or 'sbatch failed'}", stderr=exc.stderr) from exc
        return self._parsed("sbatch --test-only", parse_will_run, result.stderr + result.stdout)

    def queue(self) -> JobRows[QueueEntry]:
        """Every job slurmctld still remembers, of every tenant, in one call.

        The comment is a tenant's free text, and squeue prints it as it is, newlines
        included. So the fields are separated by a delimiter new for this call,
        which no comment written before it can hold, and the comment comes last:
        a newline in it only continues it, and no text in it can start a row.
        The format goes in squeue's environment (``SQUEUE_FORMAT``), which other
        users cannot read, not on its command line, which ``/proc`` shows to
        every user of this host.

        Not ``squeue --json``: its shape differs between Slurm 21.08, 22.05 and
        23.11, and here (22.05, openapi/v0.0.38) it took 2.5x as long as this
        format (15 ms against 6 ms for a few jobs) and printed 3.5 KB per job
        against 0.2 KB, a cost that grows with the queue.
        """
        delimiter = unpredictable_delimiter()
        # SLURM_BITSTR_LEN=0: an array's pending indices in full, never cut short at 64 characters.
        result = self._command(
            "squeue", ["--states=all"], env={"SQUEUE_FORMAT": queue_format(delimiter), "SLURM_BITSTR_LEN": "0"}
        )
        rows = self._parsed("squeue", lambda text: parse_queue(text, delimiter), result.stdout)
        _log_refused(rows.refused)
        return rows

    def find_by_tag(self, tag: str, account: str, user: str | None = None) -> int | None:
        """The job carrying ``tag``, if the user the job was submitted as submitted it: anyone can write a comment."""
        queue = self.queue()
        rows = [*queue.values(), *(task for tasks in queue.tasks.values() for task in tasks.values())]
        owned = [entry.slurm_job_id for entry in rows if self.owns(entry, account, user) and entry.comment == tag]
        # A tenant may copy its own job's tag onto another job: the first it submitted is the API's.
        return min(owned, default=None)

    def owns(self, entry: QueueEntry | AccountingEntry, account: str, user: str | None = None) -> bool:
        """Whether ``entry`` was submitted under ``account`` by ``user``: a member's own, or (None) the account's tenant user.

        The job row records which (``jobs.unix_user``), so a row is believed only
        from the one Slurm user its job was submitted as: another member of the
        same account cannot forge rows for it either.
        """
        return entry.account == account and entry.user == (user or self.settings.tenant_user_prefix + account)

    def accounting(self, job_ids: Iterable[int]) -> JobRows[AccountingEntry]:
        """Final records of jobs squeue has forgotten, in one sacct call."""
        ids = sorted(set(job_ids))
        if not ids:
            return JobRows({})
        # No free text is asked for, so "|" could not be forged either; one rule for every reader.
        delimiter = unpredictable_delimiter()
        result = self._command(
            "sacct",
            # --allusers: the service asks about its tenants' jobs, never its own.
            [
                "--allusers", "--allocations", "--parsable2", f"--delimiter={delimiter}", f"--format={_ACCT_FIELDS}",
                "--jobs=" + ",".join(map(str, ids)),
            ],
            env={"SLURM_BITSTR_LEN": "0"},  # an array's pending indices in full, as for squeue
        )
        rows = self._parsed("sacct", lambda text: parse_accounting(text, delimiter), result.stdout)
        _log_refused(rows.refused)
        return rows

    def cancel(self, slurm_job_id: int, account: str, task: int | None = None, user: str | None = None) -> None:
        """scancel as the job's own user, who can cancel its own jobs and nobody else's (an array's: all its tasks).

        ``user``: the member user the job was submitted as (None: the account's
        tenant user). With ``task``, only that task of the array ``slurm_job_id``.
        """
        target: int | str = slurm_job_id if task is None else f"{slurm_job_id}_{task}"
        self._as_tenant("scancel", lambda: self.tenants.cancel(account, [target], user=user))

    def ping(self) -> bool:
        """True when slurmctld answers; SlurmUnavailable saying why when it does not."""
        result = self._command("scontrol", ["ping"], check=False)
        if "UP" not in result.stdout:
            raise SlurmUnavailable(f"slurmctld is not answering: {result.stdout.strip() or result.stderr.strip()}")
        return True

    def controllers(self) -> list[Controller]:
        """Every slurmctld of slurm.conf (primary, backups) and whether it answers: ``scontrol ping``, read."""
        # Exits 1 when none answers: its lines still say which is which.
        result = self._command("scontrol", ["ping"], check=False)
        try:
            return parse_scontrol_ping(result.stdout)
        except StatusParseError as exc:
            raise SlurmUnavailable(f"scontrol ping: {exc} {result.stderr.strip()}".strip()) from exc

    def gpu_inventory(self) -> GpuInventory:
        result = self._command(
            "sinfo", ["--Node", f"--partition={self.settings.slurm_partition}", "--format=%N|%G|%c|%m"]
        )
        return self._parsed("sinfo", parse_inventory, result.stdout)

    def running_gpu_jobs(self) -> list[RunningJob]:
        """Every running job that holds GPUs, whoever submitted it, with its GPU indices per node."""
        result = self._command("scontrol", ["show", "job", "--details", "--oneliner"])
        records = self._parsed("scontrol", parse_job_records, result.stdout)
        if records.unreadable:
            log.warning("scontrol printed %d job record(s) that could not be read, skipped: %s", len(records.unreadable), "; ".join(records.unreadable))
        if records.doubted:
            log.warning("scontrol printed jobs %s more than once (a forged line in a job's text?): not believed", sorted(records.doubted))
        return [job for job in records.jobs if job.gpus]

    # -- the operator report ------------------------------------------------------


    def node_gpus(self) -> list[NodeGpuCapacity]:
        """Every node of the cluster, whatever its partitions, with its GPUs by type and its state now."""
        return self._parsed("sinfo", parse_node_gpus, self._command("sinfo", ["--Node", f"--format={NODE_FORMAT}"]).stdout)

    def allocations(self, start: dt.datetime, end: dt.datetime) -> list[Allocation]:
        """Every run, of every user, pending or running at some moment of [start, end]."""
        return self._parsed("sacct", parse_allocations, self._sacct_window(start, end, ALLOCATION_FIELDS).stdout)

    def node_events(self, start: dt.datetime, end: dt.datetime) -> list[NodeEvent]:
        """Node (down, drained) and cluster events that overlap [start, end], from slurmdbd."""
        result = self._command(
            "sacctmgr",
            [
                "--parsable2",
                "show",
                "event",
                f"start={start:%Y-%m-%dT%H:%M:%S}",
                f"end={end:%Y-%m-%dT%H:%M:%S}",
                "format=" + ",".join(EVENT_FIELDS),
            ],
        )
        return self._parsed("sacctmgr", parse_node_events, result.stdout)

    def node_reasons(self) -> list[NodeReason]:
        """Every node's state and reason now (``sinfo --json``): a drained node's reason, and since when."""
        return self._parsed("sinfo", parse_node_reasons, self._command("sinfo", ["--json"]).stdout)

    def node_status(self, node: str) -> NodeStatus:
        """One node's state and reason; NotFound when Slurm has no node of that name."""
        result = self._command("scontrol", ["--oneliner", "show", "node", node], check=False)
        if result.returncode != 0 and "not found" in (result.stdout + result.stderr).lower():
            raise NotFound(f"Slurm has no node {node}")
        if result.returncode != 0:
            raise CommandFailed(result.argv, result.returncode, result.stderr)
        return self._parsed("scontrol", parse_node_status, result.stdout)

    def drain_node(self, node: str, reason: str) -> None:
        """No new jobs on the node; those running finish. Slurm shows the reason (sinfo -R, scontrol show node)."""
        self._command("scontrol", ["update", f"nodename={node}", "state=drain", f"reason={reason}"])

    def resume_node(self, node: str) -> None:
        """A drained or down node back in service (Slurm clears its reason)."""
        self._command("scontrol", ["update", f"nodename={node}", "state=resume"])

    def pending_jobs(self) -> list[PendingJob]:
        """Jobs waiting now, of every tenant, with Slurm's reason and the GPUs they ask for."""
        result = self._command("squeue", ["--states=PENDING", f"--Format={PENDING_FORMAT}"])
        return self._parsed("squeue", parse_pending, result.stdout)

    # -- accounts -----------------------------------------------------------------

    def billing_accounting(self, start: dt.datetime, end: dt.datetime, fields: Sequence[str], delimiter: str) -> str:
        """Raw ``sacct`` text of every allocation, of every user, in every run, active in [start, end]."""
        return self._sacct_window(start, end, fields, delimiter=delimiter).stdout

    def admin_comments(self, job_ids: Sequence[int], delimiter: str) -> str:
        """Raw ``sacct`` text, with a header row, of each run of these jobs: ``JobIDRaw``, ``Start`` and ``AdminComment``.

        Only Slurm's operators write an AdminComment; gpupool-gpu-check records a GPU failure
        there (gpupool.gpu_health.failure), which billing reads (billing.sacct.read_gpu_failures).
        """
        args = [
            "--allusers", "--allocations", "--duplicates", "--parsable2", f"--delimiter={delimiter}",
            "--jobs=" + ",".join(str(job_id) for job_id in job_ids), "--format=JobIDRaw,Start,AdminComment",
        ]
        result = self._command("sacct", args, timeout_s=self.settings.billing_sacct_timeout_s)
        if "error:" in result.stderr:
            raise CommandFailed(result.argv, result.returncode, result.stderr)
        return result.stdout

    def _sacct_window(
        self, start: dt.datetime, end: dt.datetime, fields: Sequence[str], *, delimiter: str | None = None
    ) -> CommandResult:
        """sacct of every allocation of every user, each run apart, active in [start, end].

        sacct exits 1 when slurmdbd is down; any ``error:`` it prints is also a
        failure, so no caller mistakes a half answer for "no jobs".
        """
        args = ["--allusers", "--allocations", "--duplicates", "--parsable2"]
        if delimiter is not None:
            args.append(f"--delimiter={delimiter}")
        args += [
            f"--starttime={start:%Y-%m-%dT%H:%M:%S}",
            f"--endtime={end:%Y-%m-%dT%H:%M:%S}",
            "--format=" + ",".join(fields),
        ]
        result = self._command("sacct", args, timeout_s=self.settings.billing_sacct_timeout_s)
        if "error:" in result.stderr:
            raise CommandFailed(result.argv, result.returncode, result.stderr)
        return result

    def cancel_account_jobs(self, account: str) -> None:
        """Cancel every pending and running job of the account, each as the user (the account's, a member's) that submitted it."""
        self._as_tenant("scancel", lambda: self.tenants.cancel(account))

    def _sacctmgr_rows(self, args: Sequence[str]) -> list[str]:
        result = self._command("sacctmgr", ["--noheader", "--parsable2", *args])
        return [line for line in result.stdout.splitlines() if line.strip()]

    def budgets(self) -> dict[str, set[int | None]]:
        """Each account's Slurm budget (GrpTRESMins=gres/gpu, GPU-minutes; None: none), one value per cluster."""
        result = self._command(
            "sacctmgr", ["--parsable2", "show", "association", "format=Cluster,Account,User,GrpTRESMins"]
        )
        found: dict[str, set[int | None]] = {}
        rows = self._parsed("sacctmgr", lambda text: parse_delimited(text, required=("Account", "User", "GrpTRESMins")), result.stdout)
        for row in rows:
            if row["User"].strip():
                continue  # the account's own association carries the limit; users' rows inherit it
            found.setdefault(row["Account"].strip().lower(), set()).add(parse_int(_tres_value(row["GrpTRESMins"], BUDGET_TRES) or ""))
        return found

    def set_budget(self, account: str, gpu_minutes: int | None) -> None:
        """Set the account's Slurm budget (None: none), through root: the service is no Slurm operator."""
        self._as_tenant("sacctmgr", lambda: self.tenants.set_budget(account, gpu_minutes))

    # -- members' own users -------------------------------------------------------

    def member_limits(self) -> dict[tuple[str, str], set[tuple[int | None, int | None]]]:
        """Each user association's (GPUs at once, GPU-minutes) limits, by (account, user); one value per cluster."""
        result = self._command(
            "sacctmgr", ["--parsable2", "show", "association", "format=Cluster,Account,User,GrpTRES,GrpTRESMins"]
        )
        found: dict[tuple[str, str], set[tuple[int | None, int | None]]] = {}
        rows = self._parsed(
            "sacctmgr", lambda text: parse_delimited(text, required=("Account", "User", "GrpTRES", "GrpTRESMins")), result.stdout
        )
        for row in rows:
            user = row["User"].strip()
            if not user:
                continue  # the account's own association: billing.enforcement's
            limits = [parse_int(_tres_value(row[column], BUDGET_TRES) or "") for column in ("GrpTRES", "GrpTRESMins")]
            found.setdefault((row["Account"].strip().lower(), user), set()).add((limits[0], limits[1]))
        return found

    def set_member_limits(self, account: str, user: str, gpu_limit: int | None, gpu_minutes: int | None) -> None:
        """A member user's GPUs at once and GPU-minutes on its own association (None: none), through root."""
        self._as_tenant("sacctmgr", lambda: self.tenants.set_member_limits(account, user, gpu_limit, gpu_minutes))

    def ensure_member_user(self, account: str, user: str) -> None:
        """The member user's association under ``account`` (root: the operator's command); idempotent.

        No coordinator rights: the member cancels and changes only their own jobs.
        Its QOS are the account user's (normal and, where the cluster has it, spot).
        Its limits are set by ``set_member_limits``.
        """
        self._add_user_where_missing(account, user)
        if self._sacctmgr_rows(["show", "qos", SPOT_QOS, "format=name"]):
            self._sacctmgr_modify(
                ["user", "where", f"name={user}", f"account={account}", "set", f"qos=normal,{SPOT_QOS}", "defaultqos=normal"]
            )

    def _add_user_where_missing(self, account: str, user: str) -> bool:
        """``user``'s association under ``account`` on each cluster the account is on; whether one was added.

        One slurmdbd may serve several clusters (the multinode test cluster shares the local
        one's), and a plain ``sacctmgr add user`` fails outright where the account is missing.
        """
        held: dict[str, set[str]] = {}
        for row in self._sacctmgr_rows(["show", "association", "where", f"account={account}", "format=cluster,user"]):
            cluster, _, name = row.partition("|")
            held.setdefault(cluster, set()).add(name)
        missing = sorted(cluster for cluster, names in held.items() if user not in names)
        if missing:
            self._command(
                "sacctmgr",
                ["--immediate", "add", "user", user, f"account={account}", f"defaultaccount={account}", f"cluster={','.join(missing)}"],
            )
        return bool(missing)

    def _sacctmgr_modify(self, args: Sequence[str]) -> None:
        result = self._command("sacctmgr", ["--immediate", "modify", *args], check=False)
        # sacctmgr exits 1 with "Nothing modified" when what is set is already there.
        if result.returncode != 0 and "Nothing modified" not in result.stdout + result.stderr:
            raise CommandFailed(result.argv, result.returncode, result.stderr)

    def _associations(self, account: str) -> list[dict[str, str]]:
        """The account's associations on every cluster slurmdbd serves: the account's own (User empty) and its users'."""
        result = self._command(
            "sacctmgr",
            ["--parsable2", "show", "association", "where", f"account={account}", "format=Cluster,User,GrpTRES,GrpSubmit,QOS,DefaultQOS"],
        )
        return self._parsed(
            "sacctmgr", lambda text: parse_delimited(text, required=("User", "GrpTRES", "GrpSubmit", "QOS", "Def QOS")), result.stdout
        )

    def ensure_account(self, name: str, gpu_limit: int | None, user: str, *, max_submit_jobs: int) -> bool:
        """Create the Slurm account, the tenant user's association, its GPU cap and its job cap; idempotent.

        The job cap is GrpSubmitJobs: the account's jobs pending or running at
        once, every array task counted as one, whoever of its users submits them.
        Any association the service user kept on the account from before tenants
        is removed: the service must not be able to submit as a customer.
        Returns whether anything in Slurm changed: each setting is compared with
        what slurmdbd holds first, since sacctmgr reports "Modified" either way.
        """
        changed = False
        if not self._sacctmgr_rows(["show", "account", name, "format=account"]):
            self._command(
                "sacctmgr", ["--immediate", "add", "account", name, f"description=gpupool customer {name}", "organization=gpupool"]
            )
            changed = True
        changed |= self._add_user_where_missing(name, user)
        service = self.settings.service_user
        if service not in ("root", user) and self._sacctmgr_rows(
            ["show", "association", "where", f"account={name}", f"user={service}", "format=user"]
        ):
            self._command("sacctmgr", ["--immediate", "delete", "user", "where", f"name={service}", f"account={name}"])
            changed = True
        rows = self._associations(name)
        # Spot jobs: the tenant may run under normal or spot and no other QOS, normal unless it
        # asks; billing prices each run at its QOS's tier. A cluster whose playbook predates
        # spot has no such QOS, and the association keeps what it had.
        tenant_rows = [row for row in rows if row["User"] == user]
        if any(set(row["QOS"].split(",")) != {"normal", SPOT_QOS} or row["Def QOS"] != "normal" for row in tenant_rows) and (
            self._sacctmgr_rows(["show", "qos", SPOT_QOS, "format=name"])
        ):
            self._sacctmgr_modify(
                ["user", "where", f"name={user}", f"account={name}", "set", f"qos=normal,{SPOT_QOS}", "defaultqos=normal"]
            )
            changed = True
        wanted_gpus = None if gpu_limit is None else str(gpu_limit)
        account_rows = [row for row in rows if not row["User"]]
        if any(
            _tres_value(row["GrpTRES"], BUDGET_TRES) != wanted_gpus or row["GrpSubmit"] != str(max_submit_jobs)
            for row in account_rows
        ):
            limit = "-1" if gpu_limit is None else str(gpu_limit)
            self._sacctmgr_modify(
                ["account", "where", f"name={name}", "set", f"GrpTRES=gres/gpu={limit}", f"GrpSubmitJobs={max_submit_jobs}"]
            )
            changed = True
        return changed
