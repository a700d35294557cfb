"""Each account's own Unix identities, and the folders its jobs write to.

An account ``acme`` runs jobs as the Unix user ``gp-acme`` (the prefix is a
setting), whose uid comes from a configured range and who belongs to the
tenants group; its own group (gid = its uid) is the account's group. Each
member of the account who runs jobs gets a Unix user of their own too,
``gp-<uid>-acme`` (``member_user_name``: never the member's subject, which is
free text), with a uid from the same range, in the tenants group, and the
account's group as primary group: what the account shares, it shares through
that group. Those facts together are what the run-as helper checks before it
acts as a user (``lookup_tenant``, ``lookup_member``): it never becomes root,
the service, a user of another account, or any user that merely happens to be
called ``gp-something``.

Folders, from the top:

    job_root/                     root:root            0711  tenants pass through, list nothing
    job_root/<account>/           root:root            0711  the same: the account's users and the service pass through
    job_root/<account>/<job>/     owner:service group  0710  the service passes through, lists nothing; nobody else enters
    .../<job>/job.sbatch          owner:service group  0640  made by the run-as helper
    .../<job>/{stdout,stderr}.log owner:service group  0640  made by the run-as helper, written by slurmstepd

where owner is the user the job runs as: the member's own user, or the
account's. So the service reaches exactly the three files the helper makes for
it, by name; another member of the same account, like another account, gets no
further than a job folder's door. Everything else a job writes has the account's
group and, under the job's umask (``JOB_UMASK``, which the helper hands sbatch),
no bits for anyone else: the service can neither list it nor read it. The
account's folder is root's, so no user of the account can open it up or move
another member's job folder. A folder an earlier release made (the account's
own, 0710, or set-group-id 2750) is taken back by root and set to 0711 when the
helper next makes a job in it; a job's own, made once, stays as it was.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gpupool.config import Settings
from gpupool.errors import TenantError
from gpupool.proc import RunAs, run_command

# useradd refuses longer names on Debian and Ubuntu.
MAX_USER_NAME = 32
JOB_ROOT_MODE = 0o711
# Root's, like the job root: every user of the account passes through to their own job folders.
ACCOUNT_FOLDER_MODE = 0o711
# No set-group-id: files a job writes keep the account's group, not the service's.
TENANT_FOLDER_MODE = 0o710
# What useradd takes on Debian and Ubuntu without --badname, and what Slurm prints unchanged.
UNIX_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class Tenant:
    """A Unix user jobs of ``account`` run as: the account's own (gid: the account's group) or a member's."""

    account: str
    user: str
    uid: int
    gid: int
    # A member's: the uid of the account's own user (None: this is the account's own user).
    account_uid: int | None = None

    @property
    def is_member(self) -> bool:
        return self.account_uid is not None

    def run_as(self) -> RunAs:
        return RunAs(uid=self.uid, gid=self.gid)


def tenant_user_name(settings: Settings, account: str) -> str:
    name = settings.tenant_user_prefix + account
    if len(name) > MAX_USER_NAME:
        raise TenantError(
            f"account {account!r} is too long for a Unix user name ({name!r} has {len(name)} characters, "
            f"at most {MAX_USER_NAME}); choose a shorter account name"
        )
    return name


def service_gid(settings: Settings) -> int:
    try:
        return grp.getgrnam(settings.service_group).gr_gid
    except KeyError as exc:
        raise TenantError(f"the service group {settings.service_group!r} does not exist on this host") from exc


def _tenant_range_user(settings: Settings, name: str, missing: str) -> pwd.struct_passwd:
    """This host's user ``name``, with a uid in the tenant range; TenantError(``missing``) when there is none."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError as exc:
        raise TenantError(missing) from exc
    if not settings.tenant_uid_min <= entry.pw_uid <= settings.tenant_uid_max:
        raise TenantError(
            f"Unix user {name!r} has uid {entry.pw_uid}, outside the tenant range "
            f"{settings.tenant_uid_min}-{settings.tenant_uid_max}: gpupool will not act as it"
        )
    return entry


def lookup_tenant(settings: Settings, account: str) -> Tenant:
    """The account's Unix user, checked to be a tenant; TenantError saying why if it is not."""
    name = tenant_user_name(settings, account)
    entry = _tenant_range_user(
        settings, name,
        f"account {account!r} has no Unix user {name!r} on this host; run `gpupool account create {account}` "
        "as root here, and the playbook's tenants step on the compute nodes",
    )
    if name not in _tenants_group_members(settings):
        raise TenantError(f"Unix user {name!r} is not in the tenants group {settings.tenant_group!r}")
    return Tenant(account=account, user=name, uid=entry.pw_uid, gid=entry.pw_gid)


def member_user_name(settings: Settings, account: str, uid: int) -> str:
    """A member's Unix user: ``<prefix><uid>-<account>``, cut to fit useradd.

    Built from the uid the database records, never from the member's subject,
    which is a customer's free text. What follows the prefix starts with a
    digit, which no account name does, so no member's user can be taken for an
    account's (``<prefix><account>``); the uid alone makes it unique, and the
    account's name after it is only there for people reading ``squeue``.
    """
    head = f"{settings.tenant_user_prefix}{uid}"
    if len(head) >= MAX_USER_NAME:
        raise TenantError(f"uid {uid} with the prefix {settings.tenant_user_prefix!r} leaves no room for a user name")
    return f"{head}-{account}"[:MAX_USER_NAME].rstrip("-_")


def _tenants_group_members(settings: Settings) -> list[str]:
    try:
        return grp.getgrnam(settings.tenant_group).gr_mem
    except KeyError as exc:
        raise TenantError(f"the tenants group {settings.tenant_group!r} does not exist on this host") from exc


def lookup_member(settings: Settings, account: str, user: str) -> Tenant:
    """A member's Unix user of ``account``, checked here and not taken on the caller's word.

    It must be a valid name, have a uid in the tenant range, be in the tenants
    group, and have the account's group (the account user's own) as its primary
    group: only ``gpupool member migrate`` and the playbook, as root, make such
    users. The account's own user is accepted too.
    """
    tenant = lookup_tenant(settings, account)
    if user == tenant.user:
        return tenant
    if not UNIX_USER_NAME.fullmatch(user):
        raise TenantError(f"{user!r} is not a Unix user name gpupool makes")
    entry = _tenant_range_user(
        settings, user,
        f"account {account!r} has no member user {user!r} on this host; run `gpupool member migrate {account}` "
        "as root here, and the playbook's tenants step on the other hosts",
    )
    if entry.pw_uid == tenant.uid or entry.pw_gid != tenant.gid:
        raise TenantError(f"Unix user {user!r} is not a member user of account {account!r} (its primary group is not the account's)")
    if user not in _tenants_group_members(settings):
        raise TenantError(f"Unix user {user!r} is not in the tenants group {settings.tenant_group!r}")
    return Tenant(account=account, user=user, uid=entry.pw_uid, gid=entry.pw_gid, account_uid=tenant.uid)


def account_users(settings: Settings, account: str) -> list[Tenant]:
    """The account's own user and every member user of it on this host, each checked as ``lookup_member`` checks.

    Found from the tenants group, not from a caller: what the helper cancels when
    told to cancel all of an account's jobs.
    """
    tenant = lookup_tenant(settings, account)
    users = [tenant]
    for name in sorted(_tenants_group_members(settings)):
        if name == tenant.user:
            continue
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_gid == tenant.gid:
            try:
                users.append(lookup_member(settings, account, name))
            except TenantError:
                continue  # not one gpupool would act as (outside the range, say): left alone
    return users


def free_uid(settings: Settings, taken: set[int]) -> int:
    """The lowest uid of the tenant range that no user or group of this host, nor ``taken``, has."""
    in_use = taken | {entry.pw_uid for entry in pwd.getpwall()} | {entry.gr_gid for entry in grp.getgrall()}
    for uid in range(settings.tenant_uid_min, settings.tenant_uid_max + 1):
        if uid not in in_use:
            return uid
    raise TenantError(f"no free uid left in the tenant range {settings.tenant_uid_min}-{settings.tenant_uid_max}")


def _admin_command(argv: list[str]) -> None:
    run_command(argv, timeout_s=30)


def ensure_tenant_user(settings: Settings, account: str, *, uid: int | None = None, taken_uids: set[int] | None = None) -> Tenant:
    """Create the account's Unix user (and its own group) if missing; root only. Idempotent.

    ``uid`` pins the uid recorded in the database, so every host gets the same
    one; otherwise the lowest free uid of the range not in ``taken_uids``.
    """
    name = tenant_user_name(settings, account)
    try:
        grp.getgrnam(settings.tenant_group)
    except KeyError:
        _admin_command(["/usr/sbin/groupadd", "--system", settings.tenant_group])
    try:
        existing = pwd.getpwnam(name)
    except KeyError:
        existing = None
    if existing is None:
        new_uid = uid if uid is not None else free_uid(settings, taken_uids or set())
        try:
            grp.getgrnam(name)
        except KeyError:
            _admin_command(["/usr/sbin/groupadd", "--gid", str(new_uid), name])
        # No home, no login shell: Slurm runs the job script with its own interpreter line.
        _admin_command(
            [
                "/usr/sbin/useradd", "--uid", str(new_uid), "--gid", name, "--groups", settings.tenant_group,
                "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                "--comment", f"gpupool tenant {account}", name,
            ]
        )
    elif uid is not None and existing.pw_uid != uid:
        raise TenantError(f"Unix user {name!r} exists with uid {existing.pw_uid}, but the database records {uid}")
    elif name not in grp.getgrnam(settings.tenant_group).gr_mem:
        _admin_command(["/usr/sbin/usermod", "--append", "--groups", settings.tenant_group, name])
    return lookup_tenant(settings, account)


def ensure_member_user(settings: Settings, account: str, uid: int) -> Tenant:
    """Create a member's Unix user of ``account`` with the uid the database records; root only. Idempotent.

    No group of its own: its primary group is the account's, and it joins the
    tenants group. The comment names the account only: a member's subject is a
    customer's free text, and /etc/passwd is no place for it.
    """
    tenant = lookup_tenant(settings, account)
    name = member_user_name(settings, account, uid)
    try:
        existing = pwd.getpwnam(name)
    except KeyError:
        existing = None
    if existing is None:
        _admin_command(
            [
                "/usr/sbin/useradd", "--uid", str(uid), "--gid", str(tenant.gid), "--groups", settings.tenant_group,
                "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                "--comment", f"gpupool member of {account}", name,
            ]
        )
    elif existing.pw_uid != uid or existing.pw_gid != tenant.gid:
        raise TenantError(
            f"Unix user {name!r} exists with uid {existing.pw_uid} and group {existing.pw_gid}, but the database "
            f"records uid {uid} in account {account!r} (group {tenant.gid})"
        )
    elif name not in _tenants_group_members(settings):
        _admin_command(["/usr/sbin/usermod", "--append", "--groups", settings.tenant_group, name])
    return lookup_member(settings, account, name)


def remove_member_user(user: str) -> None:
    """Delete a member's Unix user (tests' throwaway accounts); root only."""
    run_command(["/usr/sbin/userdel", user], timeout_s=30, check=False)


def remove_tenant_user(settings: Settings, account: str) -> None:
    """Delete the account's Unix user and group (tests' throwaway accounts); root only."""
    name = tenant_user_name(settings, account)
    run_command(["/usr/sbin/userdel", name], timeout_s=30, check=False)
    run_command(["/usr/sbin/groupdel", name], timeout_s=30, check=False)


def _open_dir_nofollow(path: str, *, dir_fd: int | None = None) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _ensure_owned_dir(parent_fd: int, name: str, uid: int, gid: int, mode: int, *, taken_from: int | None = None) -> int:
    """``name`` under ``parent_fd``, created if missing, never through a symlink, given to ``uid``:``gid`` with ``mode``; its fd.

    Only root's or ``uid``'s folder is taken over, and ``taken_from``'s (a user an
    earlier release gave it to); anyone else's is refused.
    """
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    fd = _open_dir_nofollow(name, dir_fd=parent_fd)
    info = os.fstat(fd)
    if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) != (uid, gid, mode):
        if info.st_uid not in (0, uid, taken_from):
            os.close(fd)
            raise TenantError(f"{name!r} belongs to uid {info.st_uid}, not root or uid {uid if taken_from is None else taken_from}")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)  # after chown, which clears the set-group-id bit
    return fd


def ensure_job_root(settings: Settings) -> int:
    """Open (and create) the job root, traversable by tenants and listable by nobody; root only."""
    root = Path(settings.job_root)
    root.mkdir(parents=True, exist_ok=True)
    fd = _open_dir_nofollow(str(root))
    info = os.fstat(fd)
    if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) != (0, 0, JOB_ROOT_MODE):
        os.fchown(fd, 0, 0)
        os.fchmod(fd, JOB_ROOT_MODE)
    return fd


def ensure_tenant_folder(settings: Settings, tenant: Tenant, job_id: str | None = None) -> Path:
    """The account's folder (and, with ``job_id``, the job's folder in it, owned by ``tenant``), as documented above."""
    group = service_gid(settings)
    root_fd = ensure_job_root(settings)
    try:
        account_uid = tenant.uid if tenant.account_uid is None else tenant.account_uid
        # The account's folder is root's, 0711; an earlier release gave it to the account's user.
        account_fd = _ensure_owned_dir(root_fd, tenant.account, 0, 0, ACCOUNT_FOLDER_MODE, taken_from=account_uid)
    finally:
        os.close(root_fd)
    try:
        if job_id is None:
            return Path(settings.job_root) / tenant.account
        os.close(_ensure_owned_dir(account_fd, job_id, tenant.uid, group, TENANT_FOLDER_MODE))
        return Path(settings.job_root) / tenant.account / job_id
    finally:
        os.close(account_fd)
