"""``gpupool`` subcommands for operators.

Exit status: 0 on success, 1 when gpupool refuses or a dependency fails
(the message says which), 2 for a malformed command line; ``idle check``: 3
when the pass ran but some node's GPU exporter did not answer; ``account
create``: 3 when the account is made but its storage volume could not be
(``gpupool storage sync NAME`` makes it once the cause is fixed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError

from billing.money import format_nanos
from gpupool import audit, db
from gpupool.config import MAX_SUBMIT_JOBS, Settings, load_settings
from gpupool.containers import docker_runtime_refusal
from gpupool.db import is_failover_error
from gpupool.db.roles import API, BILLING, EMAIL, WEBHOOKS, ServiceRoles, apply_grants
from gpupool.errors import ConfigError, GpupoolError
from gpupool.members import identities
from gpupool.models import ACCOUNT_NAME, Account
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.runas.launch import add_serve_arguments, exec_lean_helper, serve_socket
from gpupool.slurm.tenants import ensure_tenant_folder, ensure_tenant_user
from gpupool.storage.sizes import format_size
from gpupool_cli.audit_cmds import add_audit_parsers
from gpupool_cli.billing_cmds import add_billing_parsers
from gpupool_cli.credit_cmds import add_credit_parsers
from gpupool_cli.idle_cmds import add_idle_parsers
from gpupool_cli.member_cmds import add_member_parsers, migrate_members, print_migrated
from gpupool_cli.node_cmds import add_node_parsers
from gpupool_cli.output_cmds import add_output_parsers
from gpupool_cli.report_cmds import add_report_parsers
from gpupool_cli.session_cmds import add_session_parsers
from gpupool_cli.status_cmds import add_status_parser
from gpupool_cli.storage_cmds import EXIT_STORAGE_FAILED, add_storage_parsers, apply_volume, check_growth, storage_size
from gpupool_cli.token_cmds import add_token_parsers
from gpupool_cli.webhook_cmds import add_email_parsers, add_webhook_parsers


def _account_name(value: str) -> str:
    if not ACCOUNT_NAME.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a valid account name (lowercase letters, digits, _ and -, starting with a letter, at most 32)"
        )
    return value


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return number


def _job_limit(value: str) -> int:
    number = int(value)
    if not 1 <= number <= MAX_SUBMIT_JOBS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_SUBMIT_JOBS}")
    return number


ROLE_LABELS = {API: "API", BILLING: "billing", WEBHOOKS: "webhook sender", EMAIL: "email sender"}


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    engine = db.make_engine(settings.database_url)
    roles = None
    if settings.database_api_role:
        roles = ServiceRoles(
            api=settings.database_api_role, billing=settings.database_billing_role,
            webhooks=settings.database_webhooks_role, email=settings.database_email_role,
        )
    # One transaction: no service role ever sees a new table before its grants.
    with engine.begin() as connection:
        db.upgrade(connection, args.revision)
        if roles is not None:
            apply_grants(connection, roles)
    print(f"database at revision {db.current_revision(engine)}")
    if roles is not None:
        named = [f"{name} ({ROLE_LABELS[service]})" for service, name in roles.by_service().items()]
        print(f"granted roles {', '.join(named[:-1])} and {named[-1]} their privileges")
    return 0


def cmd_account_create(settings: Settings, args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise ConfigError("account create must run as root: it creates the account's Unix user and Slurm association")
    session_factory = db.migrated_sessions(settings.database_url)
    with session_factory() as session:
        existing = session.get(Account, args.name)
        recorded_uid = existing.unix_uid if existing is not None else None
        taken = {uid for uid in session.scalars(select(Account.unix_uid)) if uid is not None}
        quota_bytes = args.storage_quota if args.storage_quota is not None else (
            existing.storage_quota_bytes if existing is not None else None
        )
    if settings.storage_root and quota_bytes is not None:
        check_growth(settings, args.name, quota_bytes)
    # Unix user and Slurm first: a database row alone could take jobs nobody can run.
    tenant = ensure_tenant_user(settings, args.name, uid=recorded_uid, taken_uids=taken)
    ensure_tenant_folder(settings, tenant)
    job_limit = settings.max_submit_jobs if args.max_submit_jobs is None else args.max_submit_jobs
    SlurmClient(settings).ensure_account(args.name, args.gpu_limit, tenant.user, max_submit_jobs=job_limit)
    with session_factory() as session, session.begin():
        account = session.get(Account, args.name)
        if account is None:
            account = Account(name=args.name)
            session.add(account)
            verb = "created"
        else:
            verb = "updated"
        account.gpu_limit = args.gpu_limit
        account.max_submit_jobs = args.max_submit_jobs
        account.unix_user, account.unix_uid = tenant.user, tenant.uid
        account.storage_quota_bytes = quota_bytes
        audit.record(
            session, audit.operator_actor(), audit.ACCOUNT_CREATE, account=args.name, now=db.utcnow(),
            details={
                "gpu_limit": args.gpu_limit, "max_submit_jobs": args.max_submit_jobs, "unix_user": tenant.user,
                "existed": verb == "updated", "storage_quota_bytes": quota_bytes,
            },
        )
    print(f"account {args.name} {verb} ({_slurm_limits(args.gpu_limit, job_limit)}; "
          f"jobs run as Unix user {tenant.user}, uid {tenant.uid})")
    refusal = docker_runtime_refusal(settings)
    if refusal is not None and verb == "created":
        print(f"warning: {refusal}; jobs with a container_image are refused (422 container_runtime_unsafe)", file=sys.stderr)
    if verb == "created":
        print(
            "compute nodes need this user too: rerun the playbook's tenants step "
            "(ansible-playbook site.yml --tags tenants)",
            file=sys.stderr,
        )
    # Run again for an account with members, it is also `gpupool member migrate <account>`.
    done, skipped = migrate_members(settings, session_factory, [args.name])
    status = print_migrated(done, skipped)
    if settings.storage_root:
        # Last: the account works without it, and a host that cannot make it says why (exit 3).
        try:
            print(apply_volume(settings, tenant, quota_bytes if quota_bytes is not None else settings.storage_default_quota_bytes))
        except GpupoolError as exc:
            print(
                f"gpupool: error: account {args.name} is {verb}, but its storage is not: {exc.message}; "
                f"once that is fixed, run `gpupool storage sync {args.name}`",
                file=sys.stderr,
            )
            return EXIT_STORAGE_FAILED
    return status


def _slurm_limits(gpu_limit: int | None, job_limit: int) -> str:
    gpus = "no GPU limit" if gpu_limit is None else f"GrpTRES=gres/gpu={gpu_limit}"
    return f"{gpus}, GrpSubmitJobs={job_limit}"


def cmd_account_sync(settings: Settings, args: argparse.Namespace) -> int:
    """Every account's Slurm association brought to what the database and the settings say (after an upgrade,
    or a new site default of max_submit_jobs); what the playbook runs on the API host."""
    if os.geteuid() != 0:
        raise ConfigError("account sync must run as root: it changes the accounts' Slurm associations")
    with db.migrated_sessions(settings.database_url)() as session:
        accounts = [
            (account.name, account.gpu_limit, account.unix_user, account.submit_job_limit(settings.max_submit_jobs))
            for account in session.scalars(select(Account).where(Account.unix_user.is_not(None)).order_by(Account.name))
        ]
    slurm = SlurmClient(settings)
    changed = 0
    for name, gpu_limit, unix_user, job_limit in accounts:
        assert unix_user is not None  # selected above
        if slurm.ensure_account(name, gpu_limit, unix_user, max_submit_jobs=job_limit):
            changed += 1
            print(f"account {name}: {_slurm_limits(gpu_limit, job_limit)}")
    # The playbook reads this line to report the task changed or not.
    print(f"changed {changed} of {len(accounts)} account(s) in Slurm")
    return 0


def cmd_account_list(settings: Settings, args: argparse.Namespace) -> int:
    with db.migrated_sessions(settings.database_url)() as session:
        accounts = list(session.scalars(select(Account).order_by(Account.name)))
        if args.json:
            # What the playbook's tenants step reads to create the same users on every node: each
            # account's own, and its members' (primary group: the account's user's own group).
            members: dict[str, list[dict[str, object]]] = {}
            for identity in identities(session):
                members.setdefault(identity.account, []).append({"unix_user": identity.unix_user, "unix_uid": identity.unix_uid})
            rows: list[dict[str, object]] = [
                {"account": a.name, "unix_user": a.unix_user, "unix_uid": a.unix_uid, "members": members.get(a.name, [])}
                for a in accounts
            ]
            if settings.storage_root:
                for row, a in zip(rows, accounts, strict=True):
                    row["storage_quota_bytes"] = a.storage_quota(settings.storage_default_quota_bytes)
            print(json.dumps(rows))
            return 0
        for account in accounts:
            limit = "-" if account.gpu_limit is None else str(account.gpu_limit)
            credit = "-" if account.prepaid_credit_nanos is None else format_nanos(account.prepaid_credit_nanos)
            monthly = "-" if account.monthly_limit_nanos is None else format_nanos(account.monthly_limit_nanos)
            jobs = account.submit_job_limit(settings.max_submit_jobs)
            storage = f"\tstorage_quota={format_size(account.storage_quota(settings.storage_default_quota_bytes))}"
            print(
                f"{account.name}\tgpu_limit={limit}\tcredit={credit}\tmonthly_limit={monthly}\tmax_submit_jobs={jobs}"
                f"{storage if settings.storage_root else ''}"
            )
    return 0


def cmd_runas_serve(settings: Settings, args: argparse.Namespace) -> int:
    exec_lean_helper(serve_socket(settings, args), args.allow_user)


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from api import create_app  # the API is a face: imported only when serving

    create_app(settings).run(host=args.host, port=args.port, threaded=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupool", description="Operate a gpupool GPU service.")
    sub = parser.add_subparsers(dest="command", required=True)

    database = sub.add_parser("db", help="database schema").add_subparsers(dest="db_command", required=True)
    upgrade = database.add_parser(
        "upgrade", help="apply migrations, then grant the API's and billing's roles (if set) their privileges"
    )
    upgrade.add_argument("--revision", default="head")
    upgrade.set_defaults(handler=cmd_db_upgrade)

    account = sub.add_parser("account", help="customer accounts").add_subparsers(dest="account_command", required=True)
    create = account.add_parser("create", help="create (or update) an account in the database and in Slurm")
    create.add_argument("name", type=_account_name)
    create.add_argument("--gpu-limit", type=_non_negative, default=None, help="GPUs the account may hold at once")
    create.add_argument(
        "--max-submit-jobs", type=_job_limit, default=None, metavar="N",
        help="jobs (each array task one) the account may have pending or running at once; default: max_submit_jobs",
    )
    create.add_argument(
        "--storage-quota", type=storage_size, default=None, metavar="SIZE",
        help="size of the account's storage, e.g. 500G (binary units); default: storage_default_quota; only grows",
    )
    create.set_defaults(handler=cmd_account_create)
    sync = account.add_parser("sync", help="bring every account's Slurm association to the database and the settings")
    sync.set_defaults(handler=cmd_account_sync)
    listing = account.add_parser("list", help="list accounts")
    listing.add_argument("--json", action="store_true", help="accounts and their Unix users as JSON")
    listing.set_defaults(handler=cmd_account_list)
    add_billing_parsers(sub, account)
    add_credit_parsers(sub)
    add_token_parsers(sub, account, _account_name)
    add_member_parsers(sub, _account_name)
    add_webhook_parsers(sub)
    add_email_parsers(sub)
    add_node_parsers(add_report_parsers(sub))
    add_session_parsers(sub)
    add_idle_parsers(sub)
    add_audit_parsers(sub)
    add_storage_parsers(sub)
    add_output_parsers(sub)
    add_status_parser(sub)

    runas = sub.add_parser("runas", help="the root helper that submits and cancels as tenants").add_subparsers(
        dest="runas_command", required=True
    )
    runas_serve = runas.add_parser("serve", help="listen on the socket (root; the service user may connect)")
    add_serve_arguments(runas_serve)
    runas_serve.set_defaults(handler=cmd_runas_serve)

    serve = sub.add_parser("serve", help="run the API with the development server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=5000)
    serve.set_defaults(handler=cmd_serve)

    from gpupool_cli.top import add_top_parser  # the view keeps its own options

    add_top_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        return args.handler(settings, args)
    except GpupoolError as exc:
        print(f"gpupool: error: {exc.message}", file=sys.stderr)
        return 1
    except DBAPIError as exc:
        if not is_failover_error(exc):
            raise
        # Gone or read-only mid-command (a failover): a message and 1, as for any dependency down.
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        print(f"gpupool: error: the database is not answering or not taking writes ({reason}); retry shortly", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
