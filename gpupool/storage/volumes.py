"""Each account's filesystem, whose size is its quota: an ext4 image, preallocated and loop-mounted.

    storage_root/.volumes/<account>.ext4   the image, root's 0600, as large as the quota, every block allocated
    storage_root/<account>/                its mount point (nosuid, nodev): root's 0700 while nothing is mounted

Why a filesystem per account, and not one filesystem with quotas: the kernel
then refuses a write past the quota (ENOSPC) whatever the tenant does, since
the tenant cannot move a byte out of its own filesystem. Project quotas (ext4,
XFS) follow a file's project id, which the file's owner may change (chattr -p,
or clearing the folder's inherit flag), and btrfs qgroups let a tenant create a
subvolume outside its qgroup, or charge another account's: neither holds
against a hostile tenant (docs/security.md). Preallocating the image
(posix_fallocate) makes the quota a reservation: an account's writes can never
fill the storage host's disk under the other accounts, and nothing is sparse.
A volume only grows (``resize2fs`` while mounted); making one smaller would
need it unmounted while no job uses it, so gpupool refuses, as hosted volumes
commonly do.

Everything here runs as root on the host that holds the storage (the NFS
server: the API host in the shipped inventories), through ``gpupool account
create``, ``gpupool account set`` and ``gpupool storage sync``; reading usage
(``volume_usage``) needs no privilege.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from gpupool.config import Settings
from gpupool.errors import ConfigError, TenantError, ValidationFailed
from gpupool.proc import run_command
from gpupool.slurm.tenants import Tenant
from gpupool.storage.paths import account_storage_dir
from gpupool.storage.sizes import format_size

VOLUMES_DIR = ".volumes"
IMAGE_SUFFIX = ".ext4"
STORAGE_ROOT_MODE = 0o711
VOLUMES_DIR_MODE = 0o700
MOUNT_POINT_MODE = 0o700
# The account's group is every one of its users' primary group (its own user's and its members',
# gpupool.slurm.tenants): the storage is shared through it.
VOLUME_ROOT_MODE = 0o770
# A default ACL on the volume's root, inherited by every folder made in it: what is created there
# gets the group's bits the creator asked for, whatever its umask (a job's is 0077, which keeps
# its job folder private). The kernel's xattr form (<linux/posix_acl_xattr.h>): version 2, then
# (tag, permissions, id) entries in tag order: the owner rwx, the group rwx, others nothing.
_ACL_XATTR = "system.posix_acl_default"
_ACL_UNDEFINED_ID = 0xFFFFFFFF
SHARED_DEFAULT_ACL = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", tag, perms, _ACL_UNDEFINED_ID) for tag, perms in ((0x01, 0o7), (0x04, 0o7), (0x20, 0o0))
)
# No set-uid file or device node of a tenant's ever counts; atime writes would cost every read a write.
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"
# An ext4 filesystem smaller than this holds little beyond its own journal.
MIN_QUOTA_BYTES = 16 * 1024 * 1024
_ADMIN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
_ACCOUNT = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Usage:
    """An account's storage as its filesystem counts it (statvfs): no walk of its files."""

    stored_bytes: int
    capacity_bytes: int
    available_bytes: int


def image_path(settings: Settings, account: str) -> Path:
    return Path(settings.storage_root) / VOLUMES_DIR / f"{account}{IMAGE_SUFFIX}"


def volume_usage(settings: Settings, account: str) -> Usage | None:
    """Bytes stored and still free in the account's filesystem; None when it is not mounted here.

    Needs no right on the account's files: statvfs resolves only the storage
    root (0711) to reach the mount point.
    """
    if not settings.storage_root:
        return None
    path = account_storage_dir(settings.storage_root, account)
    try:
        if os.stat(path).st_dev == os.stat(settings.storage_root).st_dev:
            return None  # the bare mount point: nothing mounted
        info = os.statvfs(path)
    except OSError:
        return None
    return Usage(
        stored_bytes=(info.f_blocks - info.f_bfree) * info.f_frsize,
        capacity_bytes=info.f_blocks * info.f_frsize,
        available_bytes=info.f_bavail * info.f_frsize,
    )


def _admin(argv: list[str]) -> str:
    return run_command(argv, timeout_s=_TIMEOUT_S, env=_ADMIN_ENV).stdout


def _root_only() -> None:
    if os.geteuid() != 0:
        raise ConfigError("account storage is made by root: run this as root on the host that holds the storage")


def _open_root_dir(path: Path, mode: int) -> int:
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    info = os.fstat(fd)
    if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) != (0, 0, mode):
        os.fchown(fd, 0, 0)
        os.fchmod(fd, mode)
    return fd


def mounted_source(mount_point: str) -> str | None:
    """What is mounted at ``mount_point`` (its loop device), or None."""
    result = run_command(
        ["findmnt", "--noheadings", "--output", "SOURCE", "--mountpoint", mount_point], timeout_s=30, env=_ADMIN_ENV, check=False
    )
    lines = result.stdout.split() if result.returncode == 0 else []
    return lines[-1] if lines else None


def _backing_file(device: str) -> str:
    return _admin(["losetup", "--noheadings", "--output", "BACK-FILE", device]).strip()


# Where a volume made here would be seen by this host alone.
_NETWORK_FILESYSTEMS = ("nfs", "nfs4", "ceph", "lustre", "cifs", "smb3", "glusterfs")


def _require_local(storage_root: str) -> None:
    """Refuse to make volumes on a client of the storage: nobody else would see them mounted."""
    fstype = run_command(
        ["findmnt", "--noheadings", "--output", "FSTYPE", "--target", storage_root], timeout_s=30, env=_ADMIN_ENV, check=False
    ).stdout.strip()
    if fstype in _NETWORK_FILESYSTEMS or fstype.startswith("fuse"):
        raise ConfigError(
            f"{storage_root} is on {fstype}: make the accounts' volumes on the host that holds the storage (the NFS server)"
        )


def _check_quota(quota_bytes: int) -> None:
    if quota_bytes < MIN_QUOTA_BYTES:
        raise ValidationFailed(f"a storage quota is at least {format_size(MIN_QUOTA_BYTES)}")


def _create_image(volumes_fd: int, name: str, quota_bytes: int, tenant: Tenant, image: Path) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=volumes_fd)
    try:
        os.posix_fallocate(fd, 0, quota_bytes)
    except OSError as exc:
        os.close(fd)
        os.unlink(name, dir_fd=volumes_fd)
        if exc.errno == errno.ENOSPC:
            raise ConfigError(f"the storage host has not {format_size(quota_bytes)} free for {tenant.account}'s storage") from exc
        raise
    os.close(fd)
    try:
        # nodiscard: mke2fs would otherwise punch the preallocated blocks out of the image again.
        _admin(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={tenant.uid}:{tenant.gid},nodiscard", str(image)])
    except BaseException:
        os.unlink(name, dir_fd=volumes_fd)
        raise


def _mount(image: Path, mount_point: str) -> None:
    _admin(["mount", "-o", MOUNT_OPTIONS, str(image), mount_point])


def _own_root(mount_point: str, tenant: Tenant) -> None:
    fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) != (tenant.uid, tenant.gid, VOLUME_ROOT_MODE):
            os.fchown(fd, tenant.uid, tenant.gid)
            os.fchmod(fd, VOLUME_ROOT_MODE)
        try:
            current = os.getxattr(fd, _ACL_XATTR)
        except OSError:
            current = b""
        if current != SHARED_DEFAULT_ACL:
            os.setxattr(fd, _ACL_XATTR, SHARED_DEFAULT_ACL)
    finally:
        os.close(fd)


def ensure_volume(settings: Settings, tenant: Tenant, quota_bytes: int) -> str:
    """The account's filesystem made, grown to ``quota_bytes`` and mounted, as needed; root only. Idempotent.

    Returns what it did: ``created``, ``grown``, ``mounted`` or ``unchanged``.
    """
    _root_only()
    _check_quota(quota_bytes)
    if not settings.storage_root or not _ACCOUNT.match(tenant.account):
        raise ConfigError("no storage_root is set, or the account's name is not one gpupool makes")
    root_fd = _open_root_dir(Path(settings.storage_root), STORAGE_ROOT_MODE)
    try:
        _require_local(settings.storage_root)
        volumes_fd = _open_root_dir(Path(settings.storage_root) / VOLUMES_DIR, VOLUMES_DIR_MODE)
    finally:
        os.close(root_fd)
    try:
        # One change to an account's volume at a time, whoever runs it.
        fcntl.flock(volumes_fd, fcntl.LOCK_EX)
        return _ensure_locked(settings, tenant, quota_bytes, volumes_fd)
    finally:
        os.close(volumes_fd)


def _ensure_locked(settings: Settings, tenant: Tenant, quota_bytes: int, volumes_fd: int) -> str:
    image = image_path(settings, tenant.account)
    name = image.name
    mount_point = account_storage_dir(settings.storage_root, tenant.account)
    try:
        os.mkdir(mount_point, MOUNT_POINT_MODE)
    except FileExistsError:
        pass
    if stat.S_ISLNK(os.lstat(mount_point).st_mode):
        raise TenantError(f"{mount_point} is a symbolic link, not a mount point gpupool made")
    outcome = "unchanged"
    try:
        size = os.stat(name, dir_fd=volumes_fd, follow_symlinks=False).st_size
    except FileNotFoundError:
        _create_image(volumes_fd, name, quota_bytes, tenant, image)
        size, outcome = quota_bytes, "created"
    source = mounted_source(mount_point)
    if source is None:
        _mount(image, mount_point)
        source = mounted_source(mount_point)
        outcome = "created" if outcome == "created" else "mounted"
    if source is None or _backing_file(source) != str(image):
        raise TenantError(f"{mount_point} has something mounted that is not {image}")
    if quota_bytes < size:
        raise ValidationFailed(
            f"{tenant.account}'s storage is {format_size(size)}; a volume only grows, so its quota cannot be "
            f"{format_size(quota_bytes)}"
        )
    if quota_bytes > size:
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=volumes_fd)
        try:
            os.posix_fallocate(fd, 0, quota_bytes)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise ConfigError(f"the storage host has not {format_size(quota_bytes - size)} more free") from exc
            raise
        finally:
            os.close(fd)
        size = quota_bytes
    # Also when an earlier run grew the image but could not grow the filesystem in it.
    if _filesystem_bytes(image) < size:
        _grow(source, image, mount_point)
        outcome = "grown"
    _own_root(mount_point, tenant)
    return outcome


def _filesystem_bytes(image: Path) -> int:
    """The size of the filesystem in ``image``, from its superblock."""
    fields = dict(
        line.split(":", 1) for line in _admin(["dumpe2fs", "-h", str(image)]).splitlines() if ":" in line
    )
    return int(fields["Block count"]) * int(fields["Block size"])


def _grow(device: str, image: Path, mount_point: str) -> None:
    """The mounted filesystem grown to its image's new size: online, or, where root may not (no
    CAP_SYS_RESOURCE, as in some sandboxes), unmounted for the moment it takes, if nothing uses it."""
    _admin(["losetup", "--set-capacity", device])
    online = run_command(["resize2fs", device], timeout_s=_TIMEOUT_S, env=_ADMIN_ENV, check=False)
    if online.returncode == 0:
        return
    if run_command(["umount", mount_point], timeout_s=60, env=_ADMIN_ENV, check=False).returncode != 0:
        raise ConfigError(
            f"could not grow {mount_point} while it is in use ({online.stderr.strip().splitlines()[-1:]}); "
            "run `gpupool storage sync` again when no job uses it"
        )
    try:
        # resize2fs wants a fresh check first; e2fsck's 1 means it corrected something, not a failure.
        checked = run_command(["e2fsck", "-f", "-p", str(image)], timeout_s=_TIMEOUT_S, env=_ADMIN_ENV, check=False)
        if checked.returncode > 1:
            raise ConfigError(f"e2fsck found {image} damaged (exit {checked.returncode}): {checked.stdout.strip()}")
        _admin(["resize2fs", str(image)])
    finally:
        _mount(image, mount_point)


def image_size(settings: Settings, account: str) -> int | None:
    """The account's volume's size (its quota, as made), or None when it has none."""
    try:
        return image_path(settings, account).stat().st_size
    except OSError:
        return None


def mount_all(settings: Settings) -> list[str]:
    """Every account volume found in .volumes mounted where it belongs (at boot); the accounts mounted now."""
    _root_only()
    volumes = Path(settings.storage_root) / VOLUMES_DIR
    mounted = []
    for image in sorted(volumes.glob(f"*{IMAGE_SUFFIX}")):
        account = image.name[: -len(IMAGE_SUFFIX)]
        mount_point = account_storage_dir(settings.storage_root, account)
        if not _ACCOUNT.match(account) or not os.path.isdir(mount_point) or os.path.islink(mount_point):
            continue
        if mounted_source(mount_point) is None:
            _mount(image, mount_point)
            mounted.append(account)
    return mounted


def remove_volume(settings: Settings, account: str) -> None:
    """Unmount and delete the account's volume and its files (the tests' throwaway accounts); root only."""
    _root_only()
    mount_point = account_storage_dir(settings.storage_root, account)
    if mounted_source(mount_point) is not None:
        result = run_command(["umount", mount_point], timeout_s=60, env=_ADMIN_ENV, check=False)
        if result.returncode != 0:
            _admin(["umount", "--lazy", mount_point])
    image_path(settings, account).unlink(missing_ok=True)
    try:
        os.rmdir(mount_point)
    except FileNotFoundError:
        pass
