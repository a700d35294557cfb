"""``gpupool storage``: each account's storage volume, made, grown and mounted by root on the storage's host.

    gpupool storage sync [ACCOUNT ...]   every account's volume (or these) made, grown to its quota and mounted (root)
    gpupool storage mount                every volume on this host mounted again, without the database (root; at boot)
    gpupool storage usage                each account's quota and what its volume holds (statvfs: no walk)

``account create --storage-quota`` and ``account set --storage-quota`` use the
same steps for one account.
"""

from __future__ import annotations

import argparse
import os
import sys

from sqlalchemy import select

from gpupool import db
from gpupool.config import Settings
from gpupool.errors import ConfigError, GpupoolError, NotFound, ValidationFailed
from gpupool.models import Account
from gpupool.slurm.tenants import Tenant, lookup_tenant
from gpupool.storage.paths import account_storage_dir
from gpupool.storage.sizes import format_size, parse_size
from gpupool.storage.volumes import MIN_QUOTA_BYTES, ensure_volume, image_size, mount_all, volume_usage

# `account create` when everything but the account's storage was done (run-demo.sh tells it from a failure).
EXIT_STORAGE_FAILED = 3


def storage_size(text: str) -> int:
    """An argparse type: ``500G`` in bytes, at least the smallest volume."""
    try:
        size = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size < MIN_QUOTA_BYTES:
        raise argparse.ArgumentTypeError(f"a storage quota is at least {format_size(MIN_QUOTA_BYTES)}")
    return size


def apply_volume(settings: Settings, tenant: Tenant, quota_bytes: int) -> str:
    """Make, grow and mount the account's volume (root); a line saying what happened."""
    outcome = ensure_volume(settings, tenant, quota_bytes)
    where = account_storage_dir(settings.storage_root, tenant.account)
    return f"storage of {tenant.account}: {format_size(quota_bytes)} at {where} ({outcome})"


def check_growth(settings: Settings, account: str, quota_bytes: int) -> None:
    """Refuse a quota below the volume's size, before the database records it: a volume only grows."""
    size = image_size(settings, account)
    if size is not None and quota_bytes < size:
        raise ValidationFailed(
            f"{account}'s storage is {format_size(size)}; a volume only grows, so its quota cannot be {format_size(quota_bytes)}"
        )


def set_quota_note(settings: Settings, account: str, quota_bytes: int) -> str:
    """After ``account set --storage-quota``: grow the volume now when root, else say how."""
    if os.geteuid() != 0:
        return f"storage of {account}: quota {format_size(quota_bytes)} recorded; run `sudo gpupool storage sync {account}` to grow it"
    return apply_volume(settings, lookup_tenant(settings, account), quota_bytes)


def _require_storage(settings: Settings) -> None:
    if not settings.storage_root:
        raise ConfigError("this site has no account storage: storage_root is empty")


def cmd_storage_sync(settings: Settings, args: argparse.Namespace) -> int:
    _require_storage(settings)
    if os.geteuid() != 0:
        raise ConfigError("storage sync must run as root: it makes, grows and mounts filesystems")
    with db.migrated_sessions(settings.database_url)() as session:
        query = select(Account).where(Account.unix_uid.is_not(None)).order_by(Account.name)
        if args.accounts:
            query = query.where(Account.name.in_(args.accounts))
        accounts = [(a.name, a.storage_quota(settings.storage_default_quota_bytes)) for a in session.scalars(query)]
    missing = sorted(set(args.accounts) - {name for name, _ in accounts})
    if missing:
        raise NotFound(f"no account with a Unix user named {', '.join(missing)}")
    changed = failed = 0
    for name, quota in accounts:
        try:
            line = apply_volume(settings, lookup_tenant(settings, name), quota)
        except GpupoolError as exc:
            failed += 1
            print(f"gpupool: error: storage of {name}: {exc.message}", file=sys.stderr)
            continue
        if not line.endswith("(unchanged)"):
            changed += 1
            print(line)
    # The playbook reads this line to report the task changed or not.
    print(f"changed {changed} of {len(accounts)} account volume(s)")
    return 1 if failed else 0


def cmd_storage_mount(settings: Settings, args: argparse.Namespace) -> int:
    _require_storage(settings)
    mounted = mount_all(settings)
    print(f"mounted {len(mounted)} account volume(s){': ' + ', '.join(mounted) if mounted else ''}")
    return 0


def cmd_storage_usage(settings: Settings, args: argparse.Namespace) -> int:
    _require_storage(settings)
    with db.migrated_sessions(settings.database_url)() as session:
        accounts = [(a.name, a.storage_quota(settings.storage_default_quota_bytes)) for a in session.scalars(select(Account).order_by(Account.name))]
    for name, quota in accounts:
        usage = volume_usage(settings, name)
        if usage is None:
            print(f"{name}\tquota={format_size(quota)}\tnot mounted here")
        else:
            print(f"{name}\tquota={format_size(quota)}\tstored={format_size(usage.stored_bytes)}\tfree={format_size(usage.available_bytes)}")
    return 0


def add_storage_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    storage = sub.add_parser("storage", help="each account's storage volume").add_subparsers(dest="storage_command", required=True)
    sync = storage.add_parser("sync", help="make, grow and mount every account's volume as the database says (root)")
    sync.add_argument("accounts", nargs="*", metavar="ACCOUNT", help="only these accounts")
    sync.set_defaults(handler=cmd_storage_sync)
    storage.add_parser("mount", help="mount every volume on this host again, as at boot (root)").set_defaults(handler=cmd_storage_mount)
    storage.add_parser("usage", help="each account's quota and what it stores").set_defaults(handler=cmd_storage_usage)
