"""``gpupool member set|list|remove``: the people inside an account, for the operator (gpupool.members)."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable

from billing.budgets import member_spent_nanos
from billing.calendar import period_of
from billing.money import format_nanos, parse_nanos
from gpupool import audit, db
from gpupool.config import Settings
from gpupool.members import gpus_in_flight, list_members, remove_member, set_member
from gpupool.models import Account
from gpupool.models.members import MEMBER_ROLES
from gpupool.templates import load_templates
from gpupool_cli.token_cmds import _existing_account


def cmd_member_set(settings: Settings, args: argparse.Namespace) -> int:
    templates = [name for name in args.templates.split(",") if name] if args.templates else None
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        _existing_account(session, args.account)
        row = set_member(
            session, args.account, args.subject, role=args.role, gpu_limit=args.gpu_limit,
            monthly_limit_nanos=None if args.monthly_limit is None else parse_nanos(args.monthly_limit, what="--monthly-limit"),
            templates=templates, known_templates=set(load_templates(settings.templates_dir)),
            enrolling=None, now=dt.datetime.now(dt.UTC),
        )
        role = row.role
        audit.record(
            session, audit.operator_actor(), audit.MEMBER_SET, account=args.account, target=args.subject, now=dt.datetime.now(dt.UTC),
            details={"role": row.role, "gpu_limit": row.gpu_limit, "monthly_limit": args.monthly_limit, "templates": row.templates},
        )
    print(f"{args.subject} is a {role} of account {args.account}; tokens already in use see it within {settings.token_check_cache_s:g} s")
    return 0


def cmd_member_list(settings: Settings, args: argparse.Namespace) -> int:
    period = period_of(dt.datetime.now(dt.UTC))
    with db.migrated_sessions(settings.database_url)() as session:
        account: Account = _existing_account(session, args.account)
        rows = list_members(session, account.name)
        if not rows:
            print(f"account {account.name} has no members: each of its tokens acts as its admin")
        for row in rows:
            limit = "-" if row.monthly_limit_nanos is None else format_nanos(row.monthly_limit_nanos)
            print(
                f"{row.subject}\trole={row.role}\tgpu_limit={'-' if row.gpu_limit is None else row.gpu_limit}"
                f"\tgpus_in_flight={gpus_in_flight(session, account.name, row.subject)}"
                f"\tmonthly_limit={limit}\tspent_{period}={format_nanos(member_spent_nanos(session, account.name, row.subject, period))}"
                f"\ttemplates={','.join(row.templates) if row.templates else '-'}"
            )
    return 0


def cmd_member_remove(settings: Settings, args: argparse.Namespace) -> int:
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        remove_member(session, args.account, args.subject)
        audit.record(session, audit.operator_actor(), audit.MEMBER_REMOVE, account=args.account, target=args.subject, now=dt.datetime.now(dt.UTC))
    print(f"{args.subject} is no longer a member of account {args.account}; their tokens and keys are refused from now on")
    return 0


def add_member_parsers(sub: argparse._SubParsersAction, account_name: Callable[[str], str]) -> None:
    member = sub.add_parser("member", help="the people inside an account: roles and their own limits").add_subparsers(
        dest="member_command", required=True
    )
    set_cmd = member.add_parser("set", help="add a member or change one (every setting is given anew)")
    set_cmd.add_argument("account", type=account_name)
    set_cmd.add_argument("subject", help="the token subject (`gpupool token create --user`)")
    set_cmd.add_argument("--role", required=True, choices=MEMBER_ROLES)
    set_cmd.add_argument("--gpu-limit", type=int, default=None, help="GPUs queued or running at once")
    set_cmd.add_argument("--monthly-limit", default=None, help="spend per UTC month, e.g. 250.00")
    set_cmd.add_argument("--templates", default=None, help="the only templates they may submit, comma-separated")
    set_cmd.set_defaults(handler=cmd_member_set)
    listing = member.add_parser("list", help="an account's members, their limits and this month's spend")
    listing.add_argument("account", type=account_name)
    listing.set_defaults(handler=cmd_member_list)
    remove = member.add_parser("remove", help="take a subject out of an account")
    remove.add_argument("account", type=account_name)
    remove.add_argument("subject")
    remove.set_defaults(handler=cmd_member_remove)
