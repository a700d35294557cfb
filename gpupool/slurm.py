"""The Slurm client: every Slurm command gpupool runs, through ``gpupool.proc``.

One instance is built per process and handed to ``create_app`` (or the CLI),
so tests and benchmarks can give it another ``bin_dir`` (for example a folder
of wrappers that count calls) without patching anything.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpupool.config import Settings
from gpupool.errors import CommandFailed, SlurmRejected, SlurmUnavailable
from gpupool.metrics import observe_slurm_commands
from gpupool.proc import CommandResult, minimal_env, run_command
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

Runner = Callable[..., CommandResult]

# sbatch's words for "the controller did not take the request": safe to call 503.
_UNAVAILABLE_MARKERS = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Slurm temporarily unable",
    "Transport endpoint",
    "Connection refused",
    "Zero Bytes were transmitted",
)
_QUEUE_FORMAT = "%i|%T|%r|%V|%S|%e|%N|%k"
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
class GpuInventory:
    """Largest GPU count on any one node, overall and per type."""

    max_per_node: int
    max_per_node_by_type: dict[str, int]


def _none_if_blank(value: str) -> str | None:
    value = value.strip()
    # sacct says "None assigned" for a job that never got a node.
    return None if value in ("", "None", "None assigned", "(null)", "N/A") else value


_QUEUE_COLUMNS = ("JOBID", "STATE", "REASON", "SUBMIT_TIME", "START_TIME", "END_TIME", "NODELIST", "COMMENT")
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
    for row in parse_delimited(text, required=("NODELIST", "GRES")):
        node_total = 0
        for gres in parse_gres(row["GRES"]):
            if gres.name != "gpu":
                continue
            node_total += gres.count
            if gres.gpu_type:
                by_type[gres.gpu_type] = max(by_type.get(gres.gpu_type, 0), gres.count)
        best = max(best, node_total)
    return GpuInventory(max_per_node=best, max_per_node_by_type=by_type)


class SlurmClient:
    def __init__(self, settings: Settings, runner: Runner = run_command) -> None:
        self.settings = settings
        self._run = observe_slurm_commands(runner)

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

    def submit(self, options: Sequence[str], script_path: str, *, env_path: str) -> int:
        """Submit a rendered script; options on the command line override its directives."""
        argv = [self.settings.slurm_bin("sbatch"), "--parsable", *options, script_path]
        try:
            result = self._run(
                argv,
                timeout_s=self.settings.slurm_submit_timeout_s,
                # Exported to the job by sbatch: nothing but what a job needs to run.
                env=minimal_env({"PATH": env_path}),
            )
        except CommandFailed as exc:
            if any(marker in exc.stderr for marker in _UNAVAILABLE_MARKERS):
                raise
            raise SlurmRejected(
                f"Slurm refused the job: {exc.stderr.strip() or 'sbatch failed'}",
                stderr=exc.stderr,
            ) from exc
        job_id = parse_int(result.stdout.strip().split(";", 1)[0])
        if job_id is None:
            raise SlurmUnavailable(f"sbatch printed no job id: {result.stdout!r}")
        return job_id

    def queue(self) -> dict[int, QueueEntry]:
        """Every job of the service user that slurmctld still remembers, in one call."""
        result = self._command(
            "squeue", ["--states=all", f"--user={self.settings.slurm_user}", f"--format={_QUEUE_FORMAT}"]
        )
        try:
            return parse_queue(result.stdout)
        except (ParseError, KeyError) as exc:
            raise SlurmUnavailable(f"unexpected squeue output: {exc}") from exc

    def find_by_tag(self, tag: str) -> int | None:
        for entry in self.queue().values():
            if entry.comment == tag:
                return entry.slurm_job_id
        return None

    def accounting(self, job_ids: Iterable[int]) -> dict[int, AccountingEntry]:
        """Final records of jobs squeue has forgotten, in one sacct call."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        result = self._command(
            "sacct",
            ["--allocations", "--parsable2", f"--format={_ACCT_FIELDS}", "--jobs=" + ",".join(map(str, ids))],
        )
        try:
            return parse_accounting(result.stdout)
        except (ParseError, KeyError) as exc:
            raise SlurmUnavailable(f"unexpected sacct output: {exc}") from exc

    def cancel(self, slurm_job_id: int) -> None:
        self._command("scancel", [str(slurm_job_id)])

    def ping(self) -> bool:
        """True when slurmctld answers; SlurmUnavailable saying why when it does not."""
        result = self._command("scontrol", ["ping"], check=False)
        if "UP" not in result.stdout:
            raise SlurmUnavailable(f"slurmctld is not answering: {result.stdout.strip() or result.stderr.strip()}")
        return True

    def gpu_inventory(self) -> GpuInventory:
        result = self._command(
            "sinfo", ["--Node", f"--partition={self.settings.slurm_partition}", "--format=%N|%G"]
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

    # -- accounts -----------------------------------------------------------------

    def billing_accounting(self, start: dt.datetime, end: dt.datetime, fields: Sequence[str], delimiter: str) -> str:
        """Raw ``sacct`` text of every allocation, of every user, in every run, active in [start, end].

        sacct exits 1 when slurmdbd is down; any ``error:`` it prints is also a
        failure, so a pass never mistakes a half answer for "no jobs".
        """
        window = [f"--starttime={start:%Y-%m-%dT%H:%M:%S}", f"--endtime={end:%Y-%m-%dT%H:%M:%S}"]
        result = self._command(
            "sacct",
            [
                "--allusers",
                "--allocations",
                "--duplicates",
                "--parsable2",
                f"--delimiter={delimiter}",
                *window,
                "--format=" + ",".join(fields),
            ],
            timeout_s=self.settings.billing_sacct_timeout_s,
        )
        if "error:" in result.stderr:
            raise CommandFailed(result.argv, result.returncode, result.stderr)
        return result.stdout

    def cancel_account_jobs(self, account: str) -> None:
        """Cancel every pending and running job of ``account``, whoever submitted it."""
        self._command("scancel", [f"--account={account}"])

    def _sacctmgr_rows(self, args: Sequence[str]) -> list[str]:
        result = self._command("sacctmgr", ["--noheader", "--parsable2", *args])
        return [line for line in result.stdout.splitlines() if line.strip()]

    def ensure_account(self, name: str, gpu_limit: int | None, user: str | None = None) -> None:
        """Create the Slurm account, the service user's association and its GPU cap; idempotent."""
        user = user or self.settings.slurm_user
        if not self._sacctmgr_rows(["show", "account", name, "format=account"]):
            self._command(
                "sacctmgr", ["--immediate", "add", "account", name, f"description=gpupool customer {name}", "organization=gpupool"]
            )
        if not self._sacctmgr_rows(["show", "association", "where", f"account={name}", f"user={user}", "format=user"]):
            self._command("sacctmgr", ["--immediate", "add", "user", user, f"account={name}"])
        limit = "-1" if gpu_limit is None else str(gpu_limit)
        result = self._command(
            "sacctmgr",
            ["--immediate", "modify", "account", "where", f"name={name}", "set", f"GrpTRES=gres/gpu={limit}"],
            check=False,
        )
        # sacctmgr exits 1 with "Nothing modified" when the limit is already set.
        if result.returncode != 0 and "Nothing modified" not in (result.stdout + result.stderr):
            raise CommandFailed(result.argv, result.returncode, result.stderr)
