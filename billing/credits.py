"""Credits against one run: every charge the ledger holds for it given back, per invoice period.

Three causes, one mechanism (``credit_runs``):

- a failed node (``failed_node``): a run that ended in NODE_FAIL or BOOT_FAIL,
  when the operator has ``billing_credit_failed_nodes`` on;
- a failed GPU (``gpu_failure``), when ``billing_credit_gpu_failures`` is on: a run
  that was running when gpupool-gpu-check found its GPU failed and ended it (the
  job's AdminComment, ``gpupool.gpu_health.failure``); or a run that failed on its
  own between the fault and the check: one that ended FAILED, holding GPUs on a
  node the check then drained for a failed GPU, within one check interval before
  the drain (``drain_failures``). sacct does not say which of a node's GPUs a run
  held, so on a node with several GPUs a run that failed for its own reasons on a
  healthy GPU in that interval is credited too: the operator pays for the doubt,
  never the customer;
- the operator's hand (``manual``): ``gpupool credit run <job> --reason ...``.

A GPU-failure run the ledger charged nothing (ended within its first second)
gets one line of 0.00 in the period it ended: the line is what tells its owner
(``billing.gpu_failures``), and what keeps a later pass from telling again.

Each credit is one adjustment per run and period whose ``source_key`` names the
cause, the run and the period, so a later pass that sees the run again adds
nothing; and a run credited for one cause is never credited for another (a
run is given back once, whatever the reason).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from billing.calendar import period_of
from billing.meter import RunKey
from billing.sacct import FAILED_NODE_STATES, JobRun
from gpupool.gpu_health.check import DRAIN_REASON_PREFIX, failed_gpu_in_drain_reason
from gpupool.gpu_health.failure import GpuFailure
from gpupool.models import Adjustment, LedgerEntry

FAILED_NODE, GPU_FAILURE, MANUAL = "failed-node", "gpu-failure", "manual"
# Adjustment.kind of each cause's credit lines.
KINDS = {FAILED_NODE: "failed_node_credit", GPU_FAILURE: "gpu_failure_credit", MANUAL: "manual_run_credit"}
# A run a customer, not a failure, ended is never a GPU failure's, even with the comment (a later run's).
_GPU_FAILURE_STATES = frozenset({"CANCELLED", "REQUEUED", "FAILED", "NODE_FAIL", "PREEMPTED", "TIMEOUT", "OUT_OF_MEMORY"})
# The node's clock and slurmctld's may differ by a little: a failure a few seconds past a run's end is still its.
_CLOCK_SLACK = dt.timedelta(seconds=120)

# (cluster, JobIDRaw, run start): one run of one job, across its GPU types.
RunId = tuple[str, int, dt.datetime]


@dataclass(frozen=True)
class RunCredit:
    """One run to give back, why, and the words on the invoice."""

    run: JobRun
    cause: str
    reason: str
    failure: GpuFailure | None = None


@dataclass(frozen=True)
class Written:
    """A credit line a call wrote (not one an earlier pass had)."""

    credit: RunCredit
    period: str
    amount_nanos: int


def run_id(run: JobRun) -> RunId:
    return (run.cluster, run.job_id_raw, run.start)


def _key(cause: str, run: RunId, period: str) -> str:
    cluster, job_id_raw, start = run
    return f"{cause}:{cluster}:{job_id_raw}:{start:%Y%m%dT%H%M%S}:{period}"


def failed_node_credits(runs: Iterable[JobRun], amounts: Mapping[tuple[RunKey, str], int]) -> list[tuple[JobRun, str, int]]:
    """``(run, period, credit)`` for each finished NODE_FAIL/BOOT_FAIL run's charges per period."""
    return [
        (run, period, credit)
        for run in runs if run.state in FAILED_NODE_STATES
        for period, credit in credits_per_period(run, amounts)
    ]


def credits_per_period(run: JobRun, amounts: Mapping[tuple[RunKey, str], int]) -> list[tuple[str, int]]:
    """``(period, credit)``: minus what the ledger charged the run in each period, periods in order."""
    per_period: dict[str, int] = {}
    for (run_key, period), nanos in amounts.items():
        if run_key[:3] == run_id(run) and run_key[3] in run.gpus:
            per_period[period] = per_period.get(period, 0) + nanos
    return [(period, -nanos) for period, nanos in sorted(per_period.items()) if nanos]


def gpu_failure_candidates(runs: Iterable[JobRun]) -> list[JobRun]:
    """Runs a GPU failure may have ended: finished, and not in a state only the job itself reaches."""
    return [run for run in runs if run.finished and run.state in _GPU_FAILURE_STATES]


def hit_by(run: JobRun, failure: GpuFailure) -> bool:
    """The run was running when the check found the failure: a requeued job's later runs started after it."""
    return run.start <= failure.at and (run.end is None or failure.at <= run.end + _CLOCK_SLACK)


def drain_failures(drains: Iterable[tuple[str, str, dt.datetime]]) -> list[GpuFailure]:
    """The failed GPUs named by GPU-check drains ``(node, reason, drained_at)``; other drains name none."""
    failures = []
    for node, reason, drained_at in drains:
        named = failed_gpu_in_drain_reason(reason)
        if named is not None:
            gpu, xid = named
            cause = reason.removeprefix(DRAIN_REASON_PREFIX)
            failures.append(GpuFailure(reason=cause, node=node, gpu=gpu, at=drained_at, xid=xid))
    return failures


def earliest_matching_drain(runs: Iterable[JobRun]) -> dt.datetime | None:
    """The earliest drain ``failed_before_the_check`` could tie to one of ``runs``; None when none could be."""
    ends = [run.end for run in runs if run.state == "FAILED" and run.end is not None and run.nodes]
    return min(ends) - _CLOCK_SLACK if ends else None


def failed_before_the_check(run: JobRun, drains: Sequence[GpuFailure], interval: dt.timedelta) -> GpuFailure | None:
    """The drain a run that failed on its own most likely died of: on one of its nodes, within one interval after it ended."""
    if run.state != "FAILED" or run.end is None or not run.gpus:
        return None
    for failure in drains:
        if failure.node in run.nodes and run.start <= failure.at and \
                run.end - _CLOCK_SLACK <= failure.at <= run.end + interval + _CLOCK_SLACK:
            return failure
    return None


def automatic_credits(
    runs: Sequence[JobRun], failures: Mapping[int, GpuFailure], *, failed_nodes: bool, gpu_failures: bool,
    drains: Sequence[GpuFailure] = (), check_interval: dt.timedelta = dt.timedelta(0),
) -> list[RunCredit]:
    """What a pass gives back: failed nodes' runs, runs a failed GPU ended (``failures`` by JobIDRaw),
    and runs that failed shortly before a drain for a failed GPU on their node (``drains``)."""
    credits: list[RunCredit] = []
    for run in runs:
        if failed_nodes and run.state in FAILED_NODE_STATES:
            credits.append(RunCredit(run, FAILED_NODE, f"automatic credit: job {run.job_id} ended in {run.state}"))
            continue
        if not gpu_failures or not run.finished:
            continue
        failure = failures.get(run.job_id_raw)
        if failure is not None and run.state in _GPU_FAILURE_STATES and hit_by(run, failure):
            credits.append(RunCredit(
                run, GPU_FAILURE, f"automatic credit: job {run.job_id} ended by a GPU failure ({failure.end_reason()})", failure,
            ))
            continue
        failure = failed_before_the_check(run, drains, check_interval)
        if failure is not None:
            credits.append(RunCredit(
                run, GPU_FAILURE,
                f"automatic credit: job {run.job_id} failed as a GPU failed under it ({failure.end_reason()})", failure,
            ))
    return credits


def _amounts(session: Session, runs: Iterable[JobRun]) -> dict[tuple[RunKey, str], int]:
    amounts: dict[tuple[RunKey, str], int] = {}
    for run in runs:
        query = (
            select(LedgerEntry.gpu_type, LedgerEntry.period, func.sum(LedgerEntry.amount_nanos))
            .where(
                and_(
                    LedgerEntry.cluster == run.cluster,
                    LedgerEntry.job_id_raw == run.job_id_raw,
                    LedgerEntry.run_start == run.start,
                )
            )
            .group_by(LedgerEntry.gpu_type, LedgerEntry.period)
        )
        for gpu_type, period, nanos in session.execute(query):
            amounts[((run.cluster, run.job_id_raw, run.start, gpu_type), period)] = int(nanos)
    return amounts


def credited(session: Session, run: RunId, period: str) -> bool:
    """Whether any cause has credited this run in this period already."""
    keys = [_key(cause, run, period) for cause in KINDS]
    return session.execute(select(Adjustment.id).where(or_(*(Adjustment.source_key == key for key in keys)))).first() is not None


def credit_runs(session: Session, credits: Sequence[RunCredit], now: dt.datetime, created_by: str = "gpupool billing") -> list[Written]:
    """Write each run's credit lines, once per run and period whatever the cause; the lines written now."""
    if not credits:
        return []
    amounts = _amounts(session, (credit.run for credit in credits))
    written: list[Written] = []
    for credit in credits:
        run = credit.run
        periods = credits_per_period(run, amounts)
        if not periods and credit.cause == GPU_FAILURE and run.end is not None:
            # Charged nothing (it ended within its first second): a line of 0.00 still tells the owner why the job
            # ended (end_reason, job.failed ride on the line) and, by its key, only once.
            periods = [(period_of(run.end), 0)]
        for period, amount in periods:
            if credited(session, run_id(run), period):
                continue
            session.add(
                Adjustment(
                    account=run.account,
                    period=period,
                    amount_nanos=amount,
                    reason=credit.reason,
                    kind=KINDS[credit.cause],
                    source_key=_key(credit.cause, run_id(run), period),
                    created_by=created_by,
                    created_at=now,
                )
            )
            session.flush()  # the next credit's check sees this one
            written.append(Written(credit, period, amount))
    return written


def credit_failed_nodes(session: Session, runs: Sequence[JobRun], now: dt.datetime) -> int:
    """Credit back every charge of runs that ended in NODE_FAIL or BOOT_FAIL; once per run and period."""
    return len(credit_runs(session, automatic_credits(runs, {}, failed_nodes=True, gpu_failures=False), now))
