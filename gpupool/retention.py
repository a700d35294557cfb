"""Job folders (the job's outputs, logs and script) removed once their job has been over for ``job_output_retention_days``.

Which jobs: finished ones whose end (``ended_at``, else the row's last change,
for a job that never ran) is older than the retention, and whose folder is
still there (a stat through the job root's 0711 folders: no helper call for a
folder already gone). The removal itself is the run-as helper's ``discard``,
as root on the job root: ``shutil.rmtree`` by descriptors from the account's
folder, which never follows a link a job planted. A billing pass's step looks
back ``TIMER_LOOKBACK`` past the retention only, so it does not stat every job
ever run on every pass; ``gpupool outputs prune --all`` looks at every job.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.errors import GpupoolError
from gpupool.models import Job
from gpupool.slurm.runas.actions import TenantActions
from gpupool.slurm.runas.checks import job_folder

log = logging.getLogger("gpupool.retention")

TIMER_LOOKBACK = dt.timedelta(days=7)
DAY = dt.timedelta(days=1)


@dataclass
class Pruned:
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def expired_jobs(
    sessions: sessionmaker, settings: Settings, now: dt.datetime, *, lookback: dt.timedelta | None
) -> list[tuple[str, str]]:
    """(account, job id) of each finished job over for longer than the retention (and, with ``lookback``, not much longer)."""
    cutoff = now - settings.job_output_retention_days * DAY
    ended = func.coalesce(Job.ended_at, Job.updated_at)
    query = select(Job.account, Job.id).where(Job.finished.is_(True), ended < cutoff)
    if lookback is not None:
        query = query.where(ended >= cutoff - lookback)
    with sessions() as session:
        return [(account, job_id) for account, job_id in session.execute(query.order_by(ended))]


def prune_job_folders(
    sessions: sessionmaker, settings: Settings, actions: TenantActions, now: dt.datetime, *,
    lookback: dt.timedelta | None = TIMER_LOOKBACK, dry_run: bool = False,
) -> Pruned:
    """Remove the folders of expired jobs (none when the retention is 0: kept for ever); what was removed, what failed."""
    pruned = Pruned()
    if settings.job_output_retention_days <= 0:
        return pruned
    for account, job_id in expired_jobs(sessions, settings, now, lookback=lookback):
        try:
            folder = job_folder(settings, account, job_id)
        except GpupoolError:
            continue  # not a folder gpupool made (an id or account from before today's rules)
        if not os.path.lexists(folder):
            continue
        if not dry_run:
            try:
                actions.discard(account, job_id)
            except GpupoolError as exc:
                log.warning("could not remove the folder of job %s (%s): %s", job_id, account, exc.message)
                pruned.failed[job_id] = exc.message
                continue
        pruned.removed.append(job_id)
    return pruned
