"""``gpupool credit run <job> --reason ...``: give back what a run was charged, by hand, audited.

The same credit the billing pass writes for a run a failed node or GPU ended
(``billing.credits``): one line per invoice period against the run, naming it,
never twice for one run whatever the cause. ``<job>`` is a Slurm job id
(JobIDRaw) or a gpupool job id; a job that ran more than once (requeued) has
each run credited unless ``--start`` names one. The audit row (``run.credit``,
the job as target) commits with the credit lines.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from billing.credits import MANUAL, RunCredit, credit_runs
from billing.money import format_nanos
from billing.sacct import JobRun
from gpupool import audit, db
from gpupool.config import Settings
from gpupool.errors import NotFound
from gpupool.models import LedgerEntry
from gpupool_cli.billing_cmds import parse_utc
from gpupool_cli.node_cmds import _reason


def ledger_runs(session: Session, job: str) -> list[JobRun]:
    """Each run the ledger has charged for ``job`` (a Slurm JobIDRaw, or a gpupool job id), as billing knows it."""
    where = LedgerEntry.job_id_raw == int(job) if job.isdigit() else LedgerEntry.gpupool_job_id == job
    rows = session.execute(
        select(LedgerEntry.cluster, LedgerEntry.job_id_raw, LedgerEntry.run_start, LedgerEntry.account, LedgerEntry.gpu_type)
        .where(where).distinct()
    ).all()
    runs: dict[tuple[str, int, dt.datetime], JobRun] = {}
    for cluster, job_id_raw, start, account, gpu_type in rows:
        run = runs.setdefault((cluster, job_id_raw, start), JobRun(
            cluster=cluster, job_id_raw=job_id_raw, job_id=str(job_id_raw), account=account, state="", start=start,
            end=None, elapsed_s=0, gpus={}, name="",
        ))
        run.gpus[gpu_type] = 0
    return sorted(runs.values(), key=lambda run: (run.cluster, run.job_id_raw, run.start))


def cmd_credit_run(settings: Settings, args: argparse.Namespace) -> int:
    now = db.utcnow()
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        runs = ledger_runs(session, args.job)
        if args.start is not None:
            runs = [run for run in runs if run.start == args.start]
        if not runs:
            raise NotFound(f"the ledger has no charge for job {args.job!r}" + (f" run started {args.start:%Y-%m-%dT%H:%M:%SZ}" if args.start else ""))
        reason = f"credit: job {args.job}: {args.reason}"
        written = credit_runs(session, [RunCredit(run, MANUAL, reason) for run in runs], now, created_by=args.by)
        audit.record(
            session, audit.operator_actor(), audit.RUN_CREDIT, account=runs[0].account, target=args.job, now=now,
            details={
                "reason": args.reason, "by": args.by,
                "runs": [f"{run.cluster}:{run.job_id_raw}:{run.start:%Y-%m-%dT%H:%M:%SZ}" for run in runs],
                "credited": format_nanos(-sum(line.amount_nanos for line in written)),
            },
        )
    if not written:
        print(f"job {args.job}: every run was credited already; nothing added")
        return 0
    for line in written:
        run = line.credit.run
        print(f"job {args.job} run {run.start:%Y-%m-%dT%H:%M:%SZ}: {format_nanos(line.amount_nanos)} {settings.currency} "
              f"on {run.account}'s {line.period} invoice")
    return 0


def add_credit_parsers(sub: Any) -> None:
    credit = sub.add_parser("credit", help="credit what a run was charged").add_subparsers(dest="credit_command", required=True)
    run = credit.add_parser("run", help="give back every charge of a job's run(s), once, with a reason on the invoice")
    run.add_argument("job", help="Slurm job id (JobIDRaw) or gpupool job id")
    run.add_argument("--reason", type=_reason, required=True, help="shown on the invoice line")
    run.add_argument("--start", type=parse_utc, help="only the run that started then (a requeued job has several)")
    run.add_argument("--by", default="operator", help="who made it, for the record")
    run.set_defaults(handler=cmd_credit_run)
