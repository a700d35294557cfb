"""``gpupool idle check`` (a timer, every minute) and ``gpupool idle policy set/list/delete`` (operators)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from sqlalchemy import delete, select

from gpupool import audit, db
from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.errors import ConfigError
from gpupool.gpu_usage.idle import check_idle, default_policy, set_policy
from gpupool.models import IdlePolicy
from gpupool.models.gpu_usage import ACCOUNT, TEMPLATE
from gpupool.slurm.client import SlurmClient

# The pass ran, but some nodes' GPU exporters did not answer: their jobs were neither sampled nor
# judged. Not 1 (the pass itself failed: database, Slurm), which a timer should report as a failure;
# a site whose nodes run no exporter sees this every minute while jobs run (the playbook's unit
# accepts it, SuccessExitStatus=3, and the journal names the nodes).
EXIT_NODES_UNREAD = 3


def cmd_idle_check(settings: Settings, args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = db.migrated_engine(settings.database_url)
    try:
        with db.make_session_factory(engine)() as session:
            result = check_idle(session, settings, SlurmClient(settings), db.utcnow())
    finally:
        engine.dispose()
    if result.skipped:
        print("another idle check pass is running (it holds the lock): this one did nothing")
        return 0
    print(
        f"{result.jobs} job(s) sampled ({result.samples} GPU samples, {result.pruned} old ones pruned); "
        f"{len(result.notified)} notified idle, {len(result.cancelled)} cancelled"
    )
    for job_id in result.notified:
        print(f"  job.idle: {job_id}")
    for job_id in result.cancelled:
        print(f"  cancelled: {job_id}")
    for node, error in sorted(result.node_errors.items()):
        print(f"  {node}: GPU metrics not read: {error}")
    return EXIT_NODES_UNREAD if result.node_errors else 0


def _scope(args: argparse.Namespace) -> tuple[str, str]:
    if args.account:
        return ACCOUNT, args.account
    return TEMPLATE, args.template


def cmd_policy_set(settings: Settings, args: argparse.Namespace) -> int:
    scope, name = _scope(args)
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        try:
            set_policy(
                session, scope, name, window_min=args.window_min, threshold_pct=args.threshold_pct,
                grace_min=args.grace_min, cancel=args.cancel, now=db.utcnow(),
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        audit.record(
            session, audit.operator_actor(), audit.IDLE_POLICY_SET, account=name if scope == ACCOUNT else None,
            target=f"{scope} {name}", now=db.utcnow(),
            details={"window_min": args.window_min, "threshold_pct": args.threshold_pct, "grace_min": args.grace_min, "cancel": args.cancel},
        )
    then = f"cancel {args.grace_min} min later" if args.cancel else "never cancel"
    print(f"idle policy for {scope} {name}: job.idle after {args.window_min} min under {args.threshold_pct}% on every GPU, {then}")
    return 0


def cmd_policy_list(settings: Settings, args: argparse.Namespace) -> int:
    with db.migrated_sessions(settings.database_url)() as session:
        rows = session.scalars(select(IdlePolicy).order_by(IdlePolicy.scope, IdlePolicy.name)).all()
        print("SCOPE\tNAME\tWINDOW_MIN\tTHRESHOLD_PCT\tGRACE_MIN\tCANCEL\tUPDATED")
        for row in rows:
            print(
                f"{row.scope}\t{row.name}\t{row.window_min}\t{row.threshold_pct}\t{row.grace_min}\t"
                f"{'yes' if row.cancel else 'no'}\t{utc_text(row.updated_at)}"
            )
    fallback = default_policy(settings)
    if fallback is None:
        print("default\t-\t0\t-\t-\t-\t(settings: idle_window_min = 0, other jobs are not judged)")
    else:
        print(
            f"default\t-\t{fallback.window_min}\t{fallback.threshold_pct}\t{fallback.grace_min}\t"
            f"{'yes' if fallback.cancel else 'no'}\t(settings)"
        )
    return 0


def cmd_policy_delete(settings: Settings, args: argparse.Namespace) -> int:
    scope, name = _scope(args)
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        gone = session.execute(delete(IdlePolicy).where(IdlePolicy.scope == scope, IdlePolicy.name == name))
        if getattr(gone, "rowcount", 0):
            audit.record(
                session, audit.operator_actor(), audit.IDLE_POLICY_DELETE, account=name if scope == ACCOUNT else None,
                target=f"{scope} {name}", now=db.utcnow(),
            )
    if not getattr(gone, "rowcount", 0):
        raise ConfigError(f"no idle policy for {scope} {name}")
    print(f"idle policy for {scope} {name} deleted")
    return 0


def _minutes(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be 0 or more minutes")
    return number


def _percent(value: str) -> int:
    number = int(value)
    if not 0 <= number <= 100:
        raise argparse.ArgumentTypeError("must be a percentage from 0 to 100")
    return number


def _target(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--account", default=None, help="the policy of this account's jobs (beats its template's)")
    which.add_argument("--template", default=None, help="the policy of this template's jobs")


def add_idle_parsers(sub: Any) -> None:
    idle = sub.add_parser("idle", help="idle-GPU detection").add_subparsers(dest="idle_command", required=True)
    check = idle.add_parser(
        "check",
        help="sample running jobs' GPUs, send job.idle, cancel past the grace (timer: every minute); "
        f"exit status {EXIT_NODES_UNREAD} when some node's GPU exporter did not answer",
    )
    check.set_defaults(handler=cmd_idle_check)
    policy = idle.add_parser("policy", help="idle policies per account or template").add_subparsers(
        dest="idle_policy_command", required=True
    )
    setting = policy.add_parser("set", help="create or replace a policy")
    _target(setting)
    setting.add_argument("--window-min", type=_minutes, required=True, help="minutes under the threshold before job.idle (0: never)")
    setting.add_argument("--threshold-pct", type=_percent, required=True, help="a GPU under this utilization is idle")
    setting.add_argument("--grace-min", type=_minutes, default=30, help="minutes after job.idle before a cancel (default 30)")
    setting.add_argument(
        "--cancel", action=argparse.BooleanOptionalAction, default=False, help="cancel the job after the grace (default: no)"
    )
    setting.set_defaults(handler=cmd_policy_set)
    listing = policy.add_parser("list", help="every policy, and the settings' default")
    listing.set_defaults(handler=cmd_policy_list)
    removing = policy.add_parser("delete", help="delete a policy (its jobs fall back to the template's or the default)")
    _target(removing)
    removing.set_defaults(handler=cmd_policy_delete)
