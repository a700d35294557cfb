"""``gpupool outputs prune``: remove the folders of jobs over for longer than job_output_retention_days.

    gpupool outputs prune [--all] [--dry-run]

Each billing run does the same for jobs that ended in the week before the
cutoff (gpupool.retention.TIMER_LOOKBACK); ``--all`` looks at every job, for a
first run or after the retention was shortened. The folders are removed by the
run-as helper as root (or by this command itself when run as root without one).
"""

from __future__ import annotations

import argparse
import sys

from sqlalchemy.orm import sessionmaker

from gpupool import db
from gpupool.config import Settings
from gpupool.retention import TIMER_LOOKBACK, Pruned, prune_job_folders
from gpupool.slurm.runas.actions import tenant_actions


def prune(settings: Settings, sessions: sessionmaker, *, everything: bool = False, dry_run: bool = False) -> Pruned:
    """Prune as configured, printing what was removed and what failed."""
    pruned = prune_job_folders(
        sessions, settings, tenant_actions(settings), db.utcnow(), lookback=None if everything else TIMER_LOOKBACK, dry_run=dry_run,
    )
    verb = "would remove" if dry_run else "removed"
    for job_id in pruned.removed:
        print(f"{verb} the folder of job {job_id} (over {settings.job_output_retention_days} days ago)")
    for job_id, message in pruned.failed.items():
        print(f"gpupool: warning: could not remove the folder of job {job_id}: {message}", file=sys.stderr)
    return pruned


def cmd_outputs_prune(settings: Settings, args: argparse.Namespace) -> int:
    if settings.job_output_retention_days <= 0:
        print("job_output_retention_days is 0: job folders are kept for ever; nothing to do")
        return 0
    pruned = prune(settings, db.migrated_sessions(settings.database_url), everything=args.all, dry_run=args.dry_run)
    print(f"{len(pruned.removed)} job folder(s) {'to remove' if args.dry_run else 'removed'}, {len(pruned.failed)} failed")
    return 1 if pruned.failed else 0


def add_output_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    outputs = sub.add_parser("outputs", help="jobs' output folders").add_subparsers(dest="outputs_command", required=True)
    prune_parser = outputs.add_parser("prune", help="remove the folders of jobs over for longer than job_output_retention_days")
    prune_parser.add_argument("--all", action="store_true", help=f"every job, not only those that ended in the {TIMER_LOOKBACK.days} days before the cutoff")
    prune_parser.add_argument("--dry-run", action="store_true", help="say which folders would go, remove nothing")
    prune_parser.set_defaults(handler=cmd_outputs_prune)
