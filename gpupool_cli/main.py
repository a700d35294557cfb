"""``gpupool`` subcommands for operators.

Exit status: 0 on success, 1 when gpupool refuses or a dependency fails
(the message says which), 2 for a malformed command line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sqlalchemy import select

from billing.money import format_nanos
from gpupool import db
from gpupool.config import Settings, load_settings
from gpupool.errors import GpupoolError
from gpupool.models import ACCOUNT_NAME, Account
from gpupool.slurm import SlurmClient
from gpupool.tokens import create_token
from gpupool_cli.billing_cmds import add_billing_parsers


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


def cmd_db_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    engine = db.make_engine(settings.database_url)
    db.upgrade(engine, args.revision)
    print(f"database at revision {db.current_revision(engine)}")
    return 0


def cmd_account_create(settings: Settings, args: argparse.Namespace) -> int:
    engine = db.make_engine(settings.database_url)
    db.ensure_migrated(engine)
    # Slurm first: an account that exists only in the database could take jobs Slurm refuses.
    SlurmClient(settings).ensure_account(args.name, args.gpu_limit)
    with db.make_session_factory(engine)() as session, session.begin():
        account = session.get(Account, args.name)
        if account is None:
            session.add(Account(name=args.name, gpu_limit=args.gpu_limit))
            verb = "created"
        else:
            account.gpu_limit = args.gpu_limit
            verb = "updated"
    limit = "no GPU limit" if args.gpu_limit is None else f"GrpTRES=gres/gpu={args.gpu_limit}"
    print(f"account {args.name} {verb} ({limit}; Slurm user {settings.slurm_user})")
    return 0


def cmd_account_list(settings: Settings, _args: argparse.Namespace) -> int:
    engine = db.make_engine(settings.database_url)
    db.ensure_migrated(engine)
    with db.make_session_factory(engine)() as session:
        for account in session.scalars(select(Account).order_by(Account.name)):
            limit = "-" if account.gpu_limit is None else str(account.gpu_limit)
            credit = "-" if account.prepaid_credit_nanos is None else format_nanos(account.prepaid_credit_nanos)
            monthly = "-" if account.monthly_limit_nanos is None else format_nanos(account.monthly_limit_nanos)
            print(f"{account.name}\tgpu_limit={limit}\tcredit={credit}\tmonthly_limit={monthly}")
    return 0


def cmd_token_create(settings: Settings, args: argparse.Namespace) -> int:
    print(
        create_token(
            settings,
            sub=args.user,
            account=args.account,
            role="admin" if args.admin else "customer",
            ttl_s=args.ttl,
        )
    )
    return 0


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from api import create_app  # the API is a face: imported only when serving

    create_app(settings).run(host=args.host, port=args.port, threaded=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupool", description="Operate a gpupool GPU service.")
    sub = parser.add_subparsers(dest="command", required=True)

    database = sub.add_parser("db", help="database schema").add_subparsers(dest="db_command", required=True)
    upgrade = database.add_parser("upgrade", help="apply migrations")
    upgrade.add_argument("--revision", default="head")
    upgrade.set_defaults(handler=cmd_db_upgrade)

    account = sub.add_parser("account", help="customer accounts").add_subparsers(dest="account_command", required=True)
    create = account.add_parser("create", help="create (or update) an account in the database and in Slurm")
    create.add_argument("name", type=_account_name)
    create.add_argument("--gpu-limit", type=_non_negative, default=None, help="GPUs the account may hold at once")
    create.set_defaults(handler=cmd_account_create)
    listing = account.add_parser("list", help="list accounts")
    listing.set_defaults(handler=cmd_account_list)
    add_billing_parsers(sub, account)

    token = sub.add_parser("token", help="API tokens").add_subparsers(dest="token_command", required=True)
    token_create = token.add_parser("create", help="print a signed JWT")
    token_create.add_argument("--user", required=True)
    token_create.add_argument("--account", required=True, type=_account_name)
    token_create.add_argument("--admin", action="store_true")
    token_create.add_argument("--ttl", type=int, default=None, help="lifetime in seconds")
    token_create.set_defaults(handler=cmd_token_create)

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


if __name__ == "__main__":
    sys.exit(main())
