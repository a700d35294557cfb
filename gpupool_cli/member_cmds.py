"""``gpupool member set|list|remove|migrate``: the people inside an account, for the operator (gpupool.members).

``migrate`` gives each member who runs jobs (admin, member) a Unix user and a
Slurm user of their own under the account's association
(``gpupool.slurm.tenants.ensure_member_user``), records it
(``MemberIdentity``) and sets its Slurm limits (``billing.member_limits``).
It needs root, like ``account create``, and is idempotent: rerun it after
adding members, and then the playbook's tenants step, which makes the same
users on the other hosts.
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from billing.budgets import member_spent_nanos
from billing.calendar import period_of
from billing.member_limits import push_member_limits
from billing.money import format_nanos, parse_nanos
from gpupool import audit, db
from gpupool.config import Settings
from gpupool.errors import CommandFailed, ConfigError, GpupoolError, TenantError
from gpupool.members import RUNS_JOBS, gpus_in_flight, identities, list_members, remove_member, set_member
from gpupool.models import Account, AccountMember, MemberIdentity
from gpupool.models.members import MEMBER_ROLES
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.tenants import Tenant, ensure_member_user, free_uid, member_user_name
from gpupool.templates import load_templates
from gpupool_cli.token_cmds import _existing_account


@dataclass(frozen=True)
class MemberUser:
    """One member's own user, as ``migrate_members`` left it."""

    account: str
    subject: str
    user: str
    uid: int
    created: bool


def migrate_members(settings: Settings, sessions: sessionmaker, accounts: list[str] | None) -> tuple[list[MemberUser], list[str]]:
    """Each member of ``accounts`` (None: every account) who runs jobs gets their own Unix and Slurm user; root only.

    Users recorded already are made again on this host if missing (same uid),
    and their Slurm associations likewise. Returns the members' users and the
    accounts skipped because they have no Unix user of their own yet.
    """
    if os.geteuid() != 0:
        raise ConfigError("member migrate must run as root: it creates the members' Unix users and Slurm users")
    with sessions() as session:
        query = select(AccountMember.account, AccountMember.subject).where(AccountMember.role.in_(sorted(RUNS_JOBS)))
        names = select(Account.name, Account.unix_user)
        if accounts is not None:
            query = query.where(AccountMember.account.in_(accounts))
            names = names.where(Account.name.in_(accounts))
        runners = {(account, subject) for account, subject in session.execute(query)}
        account_users = {name: user for name, user in session.execute(names)}
        known = {(row.account, row.subject): row for row in identities(session, accounts)}
        taken = {uid for uid in session.scalars(select(Account.unix_uid)) if uid is not None}
        taken |= set(session.scalars(select(MemberIdentity.unix_uid)))
    slurm = SlurmClient(settings)
    done: list[MemberUser] = []
    skipped: list[str] = []
    # Every member who runs jobs, and every user recorded already (a member who left or became a
    # viewer keeps theirs: their jobs are still followed, billed and cancelled as it).
    for account, subject in sorted(runners | set(known)):
        if account_users.get(account) is None:
            if account not in skipped:
                skipped.append(account)
            continue
        recorded = known.get((account, subject))
        if recorded is not None:
            expected = member_user_name(settings, account, recorded.unix_uid)
            if recorded.unix_user != expected:
                raise TenantError(
                    f"member {subject!r} of account {account} is recorded as Unix user {recorded.unix_user!r}, "
                    f"but uid {recorded.unix_uid} makes {expected!r} here (was tenant_user_prefix changed?)"
                )
            tenant = ensure_member_user(settings, account, recorded.unix_uid)
            slurm.ensure_member_user(account, tenant.user)
            done.append(MemberUser(account, subject, tenant.user, tenant.uid, created=False))
            continue
        # Unix user and Slurm first, as for an account: a recorded user nobody can run as would refuse the member's submits.
        tenant = _new_member_user(settings, account, taken)
        slurm.ensure_member_user(account, tenant.user)
        now = db.utcnow()
        with sessions() as session, session.begin():
            session.add(MemberIdentity(account=account, subject=subject, unix_user=tenant.user, unix_uid=tenant.uid, created_at=now))
            audit.record(
                session, audit.operator_actor(), audit.MEMBER_USER, account=account, target=subject, now=now,
                details={"unix_user": tenant.user, "unix_uid": tenant.uid},
            )
        done.append(MemberUser(account, subject, tenant.user, tenant.uid, created=True))
    if done:
        with sessions() as session:
            push_member_limits(session, slurm, settings.calendar_clock()(), accounts=sorted({user.account for user in done}))
    return done, skipped


def _new_member_user(settings: Settings, account: str, taken: set[int]) -> Tenant:
    """A new member user with the lowest free uid; another root command that took the same uid meanwhile moves it on."""
    for _attempt in range(5):
        uid = free_uid(settings, taken)
        taken.add(uid)
        try:
            return ensure_member_user(settings, account, uid)
        except CommandFailed:
            try:
                pwd.getpwuid(uid)
            except KeyError:
                raise  # not the race: useradd's own message says why
    raise TenantError(f"could not find a free uid for a member user of account {account}: every one tried was taken meanwhile")


def print_migrated(done: list[MemberUser], skipped: list[str]) -> int:
    for user in done:
        verb = "now runs" if user.created else "runs"
        print(f"member {user.subject!r} of account {user.account} {verb} jobs as Unix user {user.user} (uid {user.uid})")
    for account in skipped:
        print(f"gpupool: error: account {account} has no Unix user of its own: run `gpupool account create {account}` first", file=sys.stderr)
    if any(user.created for user in done):
        print(
            "the other hosts need these users too: rerun the playbook's tenants step (ansible-playbook site.yml --tags tenants)",
            file=sys.stderr,
        )
    return 1 if skipped else 0


def cmd_member_migrate(settings: Settings, args: argparse.Namespace) -> int:
    sessions = db.migrated_sessions(settings.database_url)
    if args.account:
        with sessions() as session:
            for name in args.account:
                _existing_account(session, name)
    done, skipped = migrate_members(settings, sessions, args.account or None)
    if not done and not skipped:
        print("no member without a Unix user of their own: nothing to do")
    return print_migrated(done, skipped)


def _limits_into_slurm(settings: Settings, account: str, subject: str) -> int:
    """A member's new limits on their own Slurm user at once (if they have one); 1 if Slurm or the helper was out of reach."""
    sessions = db.migrated_sessions(settings.database_url)
    with sessions() as session:
        if session.get(MemberIdentity, (account, subject)) is None:
            return 0
        try:
            push_member_limits(session, SlurmClient(settings), settings.calendar_clock()(), [account], [subject], raise_errors=True)
        except GpupoolError as exc:
            print(f"gpupool: error: could not give Slurm the member's new limits: {exc.message}; the next billing pass will", file=sys.stderr)
            return 1
    return 0


def cmd_member_set(settings: Settings, args: argparse.Namespace) -> int:
    templates = [name for name in args.templates.split(",") if name] if args.templates else None
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        _existing_account(session, args.account)
        row = set_member(
            session, args.account, args.subject, role=args.role, gpu_limit=args.gpu_limit,
            monthly_limit_nanos=None if args.monthly_limit is None else parse_nanos(args.monthly_limit, what="--monthly-limit"),
            templates=templates, known_templates=set(load_templates(settings.templates_dir)),
            enrolling=None, now=db.utcnow(),
        )
        role = row.role
        audit.record(
            session, audit.operator_actor(), audit.MEMBER_SET, account=args.account, target=args.subject, now=db.utcnow(),
            details={"role": row.role, "gpu_limit": row.gpu_limit, "monthly_limit": args.monthly_limit, "templates": row.templates},
        )
    print(f"{args.subject} is a {role} of account {args.account}; tokens already in use see it within {settings.token_check_cache_s:g} s")
    status = _limits_into_slurm(settings, args.account, args.subject)
    if os.geteuid() == 0 and role in RUNS_JOBS:
        # As root the operator can make the member's own user at once (member migrate for one account).
        done, skipped = migrate_members(settings, db.migrated_sessions(settings.database_url), [args.account])
        return max(status, print_migrated([user for user in done if user.created], skipped))
    if role in RUNS_JOBS:
        print(f"their jobs run as their own Unix user once root runs `gpupool member migrate {args.account}`")
    return status


def cmd_member_list(settings: Settings, args: argparse.Namespace) -> int:
    period = period_of(settings.calendar_clock()())
    with db.migrated_sessions(settings.database_url)() as session:
        account: Account = _existing_account(session, args.account)
        rows = list_members(session, account.name)
        users = {identity.subject: identity.unix_user for identity in identities(session, [account.name])}
        if not rows:
            print(f"account {account.name} has no members: each of its tokens acts as its admin")
        for row in rows:
            limit = "-" if row.monthly_limit_nanos is None else format_nanos(row.monthly_limit_nanos)
            print(
                f"{row.subject}\trole={row.role}\tunix_user={users.get(row.subject) or '-'}"
                f"\tgpu_limit={'-' if row.gpu_limit is None else row.gpu_limit}"
                f"\tgpus_in_flight={gpus_in_flight(session, account.name, row.subject)}"
                f"\tmonthly_limit={limit}\tspent_{period}={format_nanos(member_spent_nanos(session, account.name, row.subject, period))}"
                f"\ttemplates={','.join(row.templates) if row.templates else '-'}"
            )
    return 0


def cmd_member_remove(settings: Settings, args: argparse.Namespace) -> int:
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        remove_member(session, args.account, args.subject)
        audit.record(session, audit.operator_actor(), audit.MEMBER_REMOVE, account=args.account, target=args.subject, now=db.utcnow())
    print(f"{args.subject} is no longer a member of account {args.account}; their tokens and keys are refused from now on")
    return _limits_into_slurm(settings, args.account, args.subject)


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
    migrate = member.add_parser(
        "migrate",
        help="give each member who runs jobs a Unix and Slurm user of their own (root; every account, or those named)",
    )
    migrate.add_argument("account", type=account_name, nargs="*", help="accounts (default: every account)")
    migrate.set_defaults(handler=cmd_member_migrate)
