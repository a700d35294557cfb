"""Telling a job's owner that a failed GPU ended its run and the run was credited.

Called by the billing pass with the credit lines it wrote just now
(``billing.credits.credit_runs``): each GPU-failure run credited for the first
time sets the gpupool job's ``end_reason`` (``gpu_failure: Xid 79 on ... (node
gpu1)``) unless the run was requeued (the job goes on; its later run decides how
it ends), and enqueues one ``job.failed`` event, in the pass's transaction, so
the event exists exactly when the credit does.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session

from billing.credits import GPU_FAILURE, Written
from billing.money import format_nanos
from billing.sacct import JobRun
from gpupool.clock import utc_text
from gpupool.models import Job
from gpupool.webhooks.events import JOB_FAILED
from gpupool.webhooks.outbox import enqueue_job_event


def announce(session: Session, written: Sequence[Written], job_id_of: Callable[[JobRun], str | None], now: dt.datetime) -> int:
    """end_reason and one job.failed per GPU-failure run credited now; how many events."""
    credited: dict[tuple[str, int, dt.datetime], list[Written]] = {}
    for line in written:
        if line.credit.cause == GPU_FAILURE:
            run = line.credit.run
            credited.setdefault((run.cluster, run.job_id_raw, run.start), []).append(line)
    events = 0
    for lines in credited.values():
        credit = lines[0].credit
        failure = credit.failure
        job_id = job_id_of(credit.run)
        job = session.get(Job, job_id) if job_id is not None else None
        if job is None or failure is None:
            continue  # a job submitted around gpupool: its credit is on the invoice, there is no one to tell
        if credit.run.state != "REQUEUED" and job.end_reason is None:
            job.end_reason = failure.end_reason()
        events += enqueue_job_event(session, job, JOB_FAILED, now, {
            "gpu_failure": {
                "node": failure.node,
                "gpu": failure.gpu,
                "xid": failure.xid,
                "reason": failure.reason,
                "at": utc_text(failure.at),
                "requeued": credit.run.state == "REQUEUED",
            },
            "run_started_at": utc_text(credit.run.start),
            "credited": format_nanos(-sum(line.amount_nanos for line in lines)),
        })
    return events
