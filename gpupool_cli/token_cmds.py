"""``gpupool token create|list|revoke`` and ``account disable|enable``: who may call the API."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable

import jwt
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool import audit, db
from gpupool.clock import utc_text
from gpupool.config import Settings
from gpupool.errors import NotFound
from gpupool.models import Account, IssuedToken
from gpupool.slurm.client import SlurmClient
from gpupool.tokens import issue_token, revoke_token, signing_key


def _existing_account(session: Session, name: str) -> Account:
    account = session.get(Account, name)
    if account is None:
        raise NotFound(f"no account {name!r}; create it with `gpupool account create {name}`")
    return account


def cmd_token_create(settings: Settings, args: argparse.Namespace) -> int:
    # A missing key is reported before the database is touched: it is the likelier mistake.
    signing_key(settings)
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        token = issue_token(
            session,
            settings,
            sub=args.user,
            account=args.account,
            role="admin" if args.admin else "customer",
            ttl_s=args.ttl,
        )
        # Our own token, just signed: read back for its id and expiry, not trusted for anything.
        claims = jwt.decode(token, options={"verify_signature": False})
        audit.record(
            session, audit.operator_actor(), audit.TOKEN_CREATE, account=args.account, target=claims["jti"],
            details={"subject": args.user, "role": claims["role"], "expires_at": claims["exp"]}, now=db.utcnow(),
        )
    print(token)  # alone on stdout: scripts capture it
    return 0


def _token_state(token: IssuedToken, now: dt.datetime) -> str:
    if token.revoked_at is not None:
        return "revoked"
    return "expired" if token.expires_at <= now else "active"


def cmd_token_list(settings: Settings, args: argparse.Namespace) -> int:
    now = db.utcnow()
    with db.migrated_sessions(settings.database_url)() as session:
        account = _existing_account(session, args.account)
        tokens = session.scalars(
            select(IssuedToken).where(IssuedToken.account == args.account).order_by(IssuedToken.issued_at, IssuedToken.jti)
        ).all()
    if account.disabled_at is not None:
        print(f"account {args.account} is disabled since {utc_text(account.disabled_at)}: none of its tokens is accepted", file=sys.stderr)
    for token in tokens:
        revoked = "-" if token.revoked_at is None else utc_text(token.revoked_at)
        print(
            f"{token.jti}\tuser={token.subject}\trole={token.role}\tissued={utc_text(token.issued_at)}"
            f"\texpires={utc_text(token.expires_at)}\tstate={_token_state(token, now)}\trevoked={revoked}"
        )
    return 0


def cmd_token_revoke(settings: Settings, args: argparse.Namespace) -> int:
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        token, newly = revoke_token(session, args.jti, by=args.by, reason=args.reason, now=db.utcnow())
        revoked_at = token.revoked_at
        if newly:
            audit.record(
                session, audit.operator_actor(), audit.TOKEN_REVOKE, account=token.account, target=args.jti,
                details={"reason": args.reason, "by": args.by}, now=db.utcnow(),
            )
    assert revoked_at is not None
    if newly:
        print(f"token {args.jti} revoked; the API refuses it within {settings.token_check_cache_s:g} s")
    else:
        print(f"token {args.jti} was already revoked at {utc_text(revoked_at)}")
    return 0


def cmd_account_disable(settings: Settings, args: argparse.Namespace) -> int:
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        account = _existing_account(session, args.name)
        if account.disabled_at is None:
            account.disabled_at = db.utcnow()
            state = "disabled"
            audit.record(
                session, audit.operator_actor(), audit.ACCOUNT_DISABLE, account=args.name, now=account.disabled_at,
                details={"keep_jobs": args.keep_jobs},
            )
        else:
            state = f"already disabled since {utc_text(account.disabled_at)}"
    # After the commit: from here on no new token check passes, so the queue only shrinks.
    if args.keep_jobs:
        jobs = "its jobs are left in the queue"
    else:
        SlurmClient(settings).cancel_account_jobs(args.name)
        jobs = "its pending and running jobs are cancelled"
    print(f"account {args.name} {state}; its tokens are refused within {settings.token_check_cache_s:g} s; {jobs}")
    return 0


def cmd_account_enable(settings: Settings, args: argparse.Namespace) -> int:
    with db.migrated_sessions(settings.database_url)() as session, session.begin():
        account = _existing_account(session, args.name)
        was_disabled = account.disabled_at is not None
        account.disabled_at = None
        if was_disabled:
            audit.record(session, audit.operator_actor(), audit.ACCOUNT_ENABLE, account=args.name, now=db.utcnow())
    if was_disabled:
        print(f"account {args.name} enabled; its tokens that are neither revoked nor expired work again")
    else:
        print(f"account {args.name} was not disabled")
    return 0


def add_token_parsers(
    sub: argparse._SubParsersAction, account_sub: argparse._SubParsersAction, account_name: Callable[[str], str]
) -> None:
    token = sub.add_parser("token", help="API tokens").add_subparsers(dest="token_command", required=True)
    create = token.add_parser("create", help="print a signed JWT for an existing account, and record it")
    create.add_argument("--user", required=True)
    create.add_argument("--account", required=True, type=account_name)
    create.add_argument("--admin", action="store_true")
    create.add_argument("--ttl", type=int, default=None, help="lifetime in seconds (at most GPUPOOL_JWT_MAX_TTL_S)")
    create.set_defaults(handler=cmd_token_create)
    listing = token.add_parser("list", help="an account's tokens: id, user, role, times and state")
    listing.add_argument("--account", required=True, type=account_name)
    listing.set_defaults(handler=cmd_token_list)
    revoke = token.add_parser("revoke", help="refuse one token from now on (its id from `token list`)")
    revoke.add_argument("jti")
    revoke.add_argument("--reason", help="why, for the record")
    revoke.add_argument("--by", default="operator", help="who revoked it, for the record")
    revoke.set_defaults(handler=cmd_token_revoke)

    disable = account_sub.add_parser("disable", help="refuse every token of the account and cancel its queued and running jobs")
    disable.add_argument("name", type=account_name)
    disable.add_argument("--keep-jobs", action="store_true", help="leave the account's jobs in the queue")
    disable.set_defaults(handler=cmd_account_disable)
    enable = account_sub.add_parser("enable", help="accept the account's tokens again")
    enable.add_argument("name", type=account_name)
    enable.set_defaults(handler=cmd_account_enable)
