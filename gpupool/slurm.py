"""The Slurm client: every Slurm command gpupool runs, through ``gpupool.proc``.

One instance is built per process and handed to ``create_app`` (or the CLI),
so tests and benchmarks can give it another ``bin_dir`` (for example a folder
of wrappers that count calls) without patching anything. The readers of the
job-state ``squeue``/``sacct`` and inventory ``sinfo`` formats sit below, beside
their format strings; ``gpupool.slurm_parse`` maps every other parser of Slurm's text.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gpupool.config import Settings
from gpupool.errors import CommandFailed, SlurmRejected, SlurmUnavailable, SubmissionUncertain
from gpupool.metrics import observe_slurm_commands
from gpupool.proc import CommandResult, minimal_env, run_command
from gpupool.runas import TenantActions, tenant_actions
from gpupool.slurm_detail import RunningJob, parse_running_jobs
from gpupool.slurm_parse import (
    ParseError,
    base_state,
    parse_delimited,
    parse_exit_code,
    parse_gres,
    parse_int,
    parse_time,
)
from gpupool.slurm_report import (
    ALLOCATION_FIELDS,
    EVENT_FIELDS,
    NODE_FORMAT,
    PENDING_FORMAT,
    Allocation,
    NodeEvent,
    NodeGpus,
    PendingJob,
    parse_allocations,
    parse_node_events,
    parse_node_gpus,
    parse_pending,
)

Runner = Callable[..., CommandResult]
T = TypeVar("T")

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
_QUEUE_FORMAT = "%i|%T|%r|%V|%S|%e|%N|%k|%u|%a"
_ACCT_FIELDS = "JobIDRaw,State,ExitCode,Submit,Start,End,ElapsedRaw,NodeList,Reason"


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


_QUEUE_COLUMNS = ("JOBID", "STATE", "REASON", "SUBMIT_TIME", "START_TIME", "END_TIME", "NODELIST", "COMMENT")
# squeue names %u USER and %a ACCOUNT; recorded outputs from before they were asked for lack them.
_QUEUE_OPTIONAL = ("USER", "ACCOUNT")
_ACCT_COLUMNS = tuple(_ACCT_FIELDS.split(","))


def parse_queue(text: str) -> dict[int, QueueEntry]:
    entries: dict[int, QueueEntry] = {}
    for row in parse_delimited(text, required=_QUEUE_COLUMNS):
        job_id = parse_int(row["JOBID"])
        if job_id is None:  # array or het-job ids are not API jobs
            continue
        state = base_state(row["STATE"])
        entries[job_id] = QueueEntry(
            slurm_job_id=job_id,
            state=state,
            reason=_none_if_blank(row["REASON"]),
            submitted_at=parse_time(row["SUBMIT_TIME"]),
            started_at=parse_time(row["START_TIME"]) if state != "PENDING" else None,
            ended_at=parse_time(row["END_TIME"]) if state not in ("PENDING", "RUNNING") else None,
            node=_none_if_blank(row["NODELIST"]),
            comment=row["COMMENT"].strip(),
            user=row.get("USER", "").strip(),
            account=row.get("ACCOUNT", "").strip().lower(),
        )
    return entries


def parse_accounting(text: str) -> dict[int, AccountingEntry]:
    entries: dict[int, AccountingEntry] = {}
    for row in parse_delimited(text, required=_ACCT_COLUMNS):
        job_id = parse_int(row["JobIDRaw"])
        if job_id is None:
            continue
        exit_code, exit_signal = parse_exit_code(row["ExitCode"])
        entries[job_id] = AccountingEntry(
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
        )
    return entries


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

    def _command(
        self, name: str, args: Sequence[str], *, timeout_s: float | None = None, check: bool = True
    ) -> CommandResult:
        return self._run(
            [self.settings.slurm_bin(name), *args],
            timeout_s=timeout_s or self.settings.slurm_query_timeout_s,
            env=minimal_env(),
            check=check,
        )

    # -- jobs ---------------------------------------------------------------------

    def submit(self, account: str, job_id: str, script: str, options: Sequence[str]) -> int:
        """Submit a rendered script as the account's tenant; options on the command line override its directives."""
        timeout_s = self.settings.slurm_submit_timeout_s
        try:
            result = self._as_tenant(
                "sbatch", lambda: self.tenants.submit(account, job_id, script, options, timeout_s=timeout_s)
            )
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

    def queue(self) -> dict[int, QueueEntry]:
        """Every job slurmctld still remembers, of every tenant, in one call."""
        result = self._command("squeue", ["--states=all", f"--format={_QUEUE_FORMAT}"])
        try:
            return parse_queue(result.stdout)
        except (ParseError, KeyError) as exc:
            raise SlurmUnavailable(f"unexpected squeue output: {exc}") from exc

    def find_by_tag(self, tag: str, account: str) -> int | None:
        """The job carrying ``tag``, if the account's own tenant submitted it: anyone can write a comment."""
        for entry in self.queue().values():
            if self.owns(entry, account) and entry.comment == tag:
                return entry.slurm_job_id
        return None

    def owns(self, entry: QueueEntry, account: str) -> bool:
        """Whether ``entry`` was submitted by ``account``'s tenant user, under that account."""
        return entry.account == account and entry.user == self.settings.tenant_user_prefix + account

    def accounting(self, job_ids: Iterable[int]) -> dict[int, AccountingEntry]:
        """Final records of jobs squeue has forgotten, in one sacct call."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        result = self._command(
            "sacct",
            # --allusers: the service asks about its tenants' jobs, never its own.
            ["--allusers", "--allocations", "--parsable2", f"--format={_ACCT_FIELDS}", "--jobs=" + ",".join(map(str, ids))],
        )
        try:
            return parse_accounting(result.stdout)
        except (ParseError, KeyError) as exc:
            raise SlurmUnavailable(f"unexpected sacct output: {exc}") from exc

    def cancel(self, slurm_job_id: int, account: str) -> None:
        """scancel as the account's tenant, who can cancel its own jobs and nobody else's."""
        self._as_tenant("scancel", lambda: self.tenants.cancel(account, [slurm_job_id]))

    def ping(self) -> bool:
        """True when slurmctld answers; SlurmUnavailable saying why when it does not."""
        result = self._command("scontrol", ["ping"], check=False)
        if "UP" not in result.stdout:
            raise SlurmUnavailable(f"slurmctld is not answering: {result.stdout.strip() or result.stderr.strip()}")
        return True

    def gpu_inventory(self) -> GpuInventory:
        result = self._command(
            "sinfo", ["--Node", f"--partition={self.settings.slurm_partition}", "--format=%N|%G|%c|%m"]
        )
        try:
            return parse_inventory(result.stdout)
        except (ParseError, KeyError) as exc:
            raise SlurmUnavailable(f"unexpected sinfo output: {exc}") from exc

    def running_gpu_jobs(self) -> list[RunningJob]:
        """Every running job that holds GPUs, whoever submitted it, with its GPU indices per node."""
        result = self._command("scontrol", ["show", "job", "--details", "--oneliner"])
        try:
            jobs = parse_running_jobs(result.stdout)
        except (ParseError, KeyError, ValueError) as exc:
            raise SlurmUnavailable(f"unexpected scontrol output: {exc}") from exc
        return [job for job in jobs if job.gpus]

    # -- the operator report ------------------------------------------------------

    def _parsed(self, what: str, parse: Callable[[str], T], result: CommandResult) -> T:
        try:
            return parse(result.stdout)
        except (ParseError, KeyError, ValueError) as exc:
            raise SlurmUnavailable(f"unexpected {what} output: {exc}") from exc

    def node_gpus(self) -> list[NodeGpus]:
        """Every node of the cluster, whatever its partitions, with its GPUs by type and its state now."""
        return self._parsed("sinfo", parse_node_gpus, self._command("sinfo", ["--Node", f"--format={NODE_FORMAT}"]))

    def allocations(self, start: dt.datetime, end: dt.datetime) -> list[Allocation]:
        """Every run, of every user, pending or running at some moment of [start, end]."""
        return self._parsed("sacct", parse_allocations, self._sacct_window(start, end, ALLOCATION_FIELDS))

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
        return self._parsed("sacctmgr", parse_node_events, result)

    def pending_jobs(self) -> list[PendingJob]:
        """Jobs waiting now, of every tenant, with Slurm's reason and the GPUs they ask for."""
        result = self._command("squeue", ["--states=PENDING", f"--Format={PENDING_FORMAT}"])
        return self._parsed("squeue", parse_pending, result)

    # -- accounts -----------------------------------------------------------------

    def billing_accounting(self, start: dt.datetime, end: dt.datetime, fields: Sequence[str], delimiter: str) -> str:
        """Raw ``sacct`` text of every allocation, of every user, in every run, active in [start, end]."""
        return self._sacct_window(start, end, fields, delimiter=delimiter).stdout

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
        """Cancel every pending and running job the account's tenant submitted, as that tenant."""
        self._as_tenant("scancel", lambda: self.tenants.cancel(account))

    def _sacctmgr_rows(self, args: Sequence[str]) -> list[str]:
        result = self._command("sacctmgr", ["--noheader", "--parsable2", *args])
        return [line for line in result.stdout.splitlines() if line.strip()]

    def ensure_account(self, name: str, gpu_limit: int | None, user: str) -> None:
        """Create the Slurm account, the tenant user's association and its GPU cap; idempotent.

        Any association the service user kept on the account from before tenants
        is removed: the service must not be able to submit as a customer.
        """
        if not self._sacctmgr_rows(["show", "account", name, "format=account"]):
            self._command(
                "sacctmgr", ["--immediate", "add", "account", name, f"description=gpupool customer {name}", "organization=gpupool"]
            )
        if not self._sacctmgr_rows(["show", "association", "where", f"account={name}", f"user={user}", "format=user"]):
            self._command("sacctmgr", ["--immediate", "add", "user", user, f"account={name}", f"defaultaccount={name}"])
        service = self.settings.service_user
        if service not in ("root", user) and self._sacctmgr_rows(
            ["show", "association", "where", f"account={name}", f"user={service}", "format=user"]
        ):
            self._command("sacctmgr", ["--immediate", "delete", "user", "where", f"name={service}", f"account={name}"])
        limit = "-1" if gpu_limit is None else str(gpu_limit)
        result = self._command(
            "sacctmgr",
            ["--immediate", "modify", "account", "where", f"name={name}", "set", f"GrpTRES=gres/gpu={limit}"],
            check=False,
        )
        # sacctmgr exits 1 with "Nothing modified" when the limit is already set.
        if result.returncode != 0 and "Nothing modified" not in (result.stdout + result.stderr):
            raise CommandFailed(result.argv, result.returncode, result.stderr)
