"""Each account's own Unix identity, and the folders its jobs write to.

An account ``acme`` runs every job as the Unix user ``gp-acme`` (the prefix is
a setting), whose uid comes from a configured range and who belongs to the
tenants group. Those three facts together are what the run-as helper checks
before it acts as a user: it never becomes root, the service, or any account
that merely happens to be called ``gp-something``.

Folders, from the top:

    job_root/                     root:root            0711  tenants pass through, list nothing
    job_root/<account>/           tenant:service group 0710  the service passes through, lists nothing
    job_root/<account>/<job>/     tenant:service group 0710  the same
    .../<job>/job.sbatch          tenant:service group 0640  made by the run-as helper
    .../<job>/{stdout,stderr}.log tenant:service group 0640  made by the run-as helper, written by slurmstepd

So the service reaches exactly the three files the helper makes for it, by
name; no other tenant gets past the account's folder. Everything else a job
writes has the tenant's own group and, under the job's umask (``JOB_UMASK``,
which the helper hands sbatch), no bits for anyone else: the service can
neither list it nor read it. A folder an earlier release made set-group-id
2750 is set to 0710 when the helper next makes a job in it: the account's at
the next submit; a job's own, made once, stays as it was.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from gpupool.config import Settings
from gpupool.errors import TenantError
from gpupool.proc import RunAs, run_command

# useradd refuses longer names on Debian and Ubuntu.
MAX_USER_NAME = 32
JOB_ROOT_MODE = 0o711
# No set-group-id: files a job writes keep the tenant's own group, not the service's.
TENANT_FOLDER_MODE = 0o710


@dataclass(frozen=True)
class Tenant:
    account: str
    user: str
    uid: int
    gid: int

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


def lookup_tenant(settings: Settings, account: str) -> Tenant:
    """The account's Unix user, checked to be a tenant; TenantError saying why if it is not."""
    name = tenant_user_name(settings, account)
    try:
        entry = pwd.getpwnam(name)
    except KeyError as exc:
        raise TenantError(
            f"account {account!r} has no Unix user {name!r} on this host; run `gpupool account create {account}` "
            "as root here, and the playbook's tenants step on the compute nodes"
        ) from exc
    if not settings.tenant_uid_min <= entry.pw_uid <= settings.tenant_uid_max:
        raise TenantError(
            f"Unix user {name!r} has uid {entry.pw_uid}, outside the tenant range "
            f"{settings.tenant_uid_min}-{settings.tenant_uid_max}: gpupool will not act as it"
        )
    try:
        members = grp.getgrnam(settings.tenant_group).gr_mem
    except KeyError as exc:
        raise TenantError(f"the tenants group {settings.tenant_group!r} does not exist on this host") from exc
    if name not in members:
        raise TenantError(f"Unix user {name!r} is not in the tenants group {settings.tenant_group!r}")
    return Tenant(account=account, user=name, uid=entry.pw_uid, gid=entry.pw_gid)


def _free_uid(settings: Settings, taken: set[int]) -> int:
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
        new_uid = uid if uid is not None else _free_uid(settings, taken_uids or set())
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


def remove_tenant_user(settings: Settings, account: str) -> None:
    """Delete the account's Unix user and group (tests' throwaway accounts); root only."""
    name = tenant_user_name(settings, account)
    run_command(["/usr/sbin/userdel", name], timeout_s=30, check=False)
    run_command(["/usr/sbin/groupdel", name], timeout_s=30, check=False)


def _open_dir_nofollow(path: str, *, dir_fd: int | None = None) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _ensure_owned_dir(parent_fd: int, name: str, uid: int, gid: int, mode: int) -> int:
    """``name`` under ``parent_fd``, created if missing, never through a symlink; returns its fd."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    fd = _open_dir_nofollow(name, dir_fd=parent_fd)
    info = os.fstat(fd)
    if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) != (uid, gid, mode):
        if info.st_uid not in (0, uid):
            os.close(fd)
            raise TenantError(f"{name!r} belongs to uid {info.st_uid}, not the tenant {uid}")
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
    """The tenant's folder (and, with ``job_id``, the job's folder in it), owned as documented above."""
    group = service_gid(settings)
    root_fd = ensure_job_root(settings)
    try:
        account_fd = _ensure_owned_dir(root_fd, tenant.account, tenant.uid, group, TENANT_FOLDER_MODE)
    finally:
        os.close(root_fd)
    try:
        if job_id is None:
            return Path(settings.job_root) / tenant.account
        os.close(_ensure_owned_dir(account_fd, job_id, tenant.uid, group, TENANT_FOLDER_MODE))
        return Path(settings.job_root) / tenant.account / job_id
    finally:
        os.close(account_fd)
