"""Automatic credits for runs that a failed node ended (NODE_FAIL, BOOT_FAIL).

When the operator turns ``billing_credit_failed_nodes`` on, a pass that sees
such a run gives back everything the ledger charged for it, as one adjustment
per invoice period. The adjustment's ``source_key`` names the run and period,
so a later pass that sees the run again adds nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from billing.meter import RunKey
from billing.sacct import FAILED_NODE_STATES, JobRun
from gpupool.models import Adjustment, LedgerEntry


def failed_node_credits(runs: Iterable[JobRun], amounts: Mapping[tuple[RunKey, str], int]) -> list[tuple[JobRun, str, int]]:
    """``(run, period, credit)`` for each finished NODE_FAIL/BOOT_FAIL run's charges per period."""
    credits: list[tuple[JobRun, str, int]] = []
    for run in runs:
        if run.state not in FAILED_NODE_STATES:
            continue
        per_period: dict[str, int] = {}
        for gpu_type in run.gpus:
            key = (run.cluster, run.job_id_raw, run.start, gpu_type)
            for (run_key, period), nanos in amounts.items():
                if run_key == key:
                    per_period[period] = per_period.get(period, 0) + nanos
        credits.extend((run, period, -nanos) for period, nanos in sorted(per_period.items()) if nanos)
    return credits


def credit_failed_nodes(session: Session, runs: Sequence[JobRun], now: dt.datetime) -> int:
    """Credit back every charge of runs that ended in NODE_FAIL or BOOT_FAIL; once per run and period."""
    failed = [run for run in runs if run.state in FAILED_NODE_STATES]
    if not failed:
        return 0
    amounts: dict[tuple[RunKey, str], int] = {}
    for run in failed:
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
    written = 0
    for run, period, credit in failed_node_credits(failed, amounts):
        key = f"failed-node:{run.cluster}:{run.job_id_raw}:{run.start:%Y%m%dT%H%M%S}:{period}"
        if session.execute(select(Adjustment.id).where(Adjustment.source_key == key)).first():
            continue
        session.add(
            Adjustment(
                account=run.account,
                period=period,
                amount_nanos=credit,
                reason=f"automatic credit: job {run.job_id} ended in {run.state}",
                kind="failed_node_credit",
                source_key=key,
                created_by="gpupool billing",
                created_at=now,
            )
        )
        written += 1
    session.flush()
    return written
