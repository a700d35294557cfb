"""The operator's storage commands, as root, on real volumes: create with a quota, grow, refuse to shrink, remount."""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.support.services import TENANT_PREFIX
from bench.support.storage import storage_root_for_tests
from bench.support.tenancy import SERVICE_USER
from gpupool.config import load_settings
from gpupool.storage.volumes import SHARED_DEFAULT_ACL, remove_volume, volume_usage
from tests.conftest import JWT_SECRET, REPO, slurm_cmd

pytestmark = [pytest.mark.cluster]

GPUPOOL = str(Path(sys.executable).parent / "gpupool")
MIB = 1024 * 1024


@pytest.fixture
def site(tmp_path: Path, job_root: Path) -> Iterator[tuple[dict[str, str], Path, str]]:
    """A site's settings (SQLite, its own storage root), and an account name removed afterwards."""
    name = f"s{secrets.token_hex(4)}"
    with storage_root_for_tests() as storage_root:
        env = {
            "PATH": "/usr/bin:/bin",
            "GPUPOOL_DATABASE_URL": f"sqlite:///{tmp_path}/cli.db",
            "GPUPOOL_JWT_SECRET": JWT_SECRET,
            "GPUPOOL_TEMPLATES_DIR": str(REPO / "slurm_templates"),
            "GPUPOOL_SERVICE_GROUP": SERVICE_USER,
            "GPUPOOL_JOB_ROOT": str(job_root),
            "GPUPOOL_STORAGE_ROOT": str(storage_root),
            "GPUPOOL_STORAGE_DEFAULT_QUOTA": "16M",
        }
        assert gpupool(env, "db", "upgrade").returncode == 0
        yield env, storage_root, name
        remove_volume(load_settings(environ=env), name)
        slurm_cmd("sacctmgr", "-i", "delete", "account", name, check=False)
        slurm_cmd("/usr/sbin/userdel", TENANT_PREFIX + name, check=False)
        slurm_cmd("/usr/sbin/groupdel", TENANT_PREFIX + name, check=False)


def gpupool(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUPOOL, *args], env=env, capture_output=True, text=True, timeout=300, check=False)


def test_account_storage_is_made_with_its_quota_grown_never_shrunk_and_mounted_again(site: tuple[dict[str, str], Path, str]) -> None:
    env, storage_root, name = site
    settings = load_settings(environ=env)
    created = gpupool(env, "account", "create", name, "--gpu-limit", "1", "--storage-quota", "24M")
    assert created.returncode == 0, created.stderr
    assert f"storage of {name}: 24 MiB at {storage_root / name} (created)" in created.stdout
    folder = (storage_root / name).stat()
    assert stat.S_IMODE(folder.st_mode) == 0o770 and folder.st_uid == folder.st_gid  # the tenant's, and its group's
    assert os.getxattr(storage_root / name, "system.posix_acl_default") == SHARED_DEFAULT_ACL  # shared with its members
    usage = volume_usage(settings, name)
    assert usage is not None and 16 * MIB < usage.capacity_bytes <= 24 * MIB
    listed = json.loads(gpupool(env, "account", "list", "--json").stdout)
    assert [row["storage_quota_bytes"] for row in listed if row["account"] == name] == [24 * MIB]

    grown = gpupool(env, "account", "set", name, "--storage-quota", "40M")
    assert grown.returncode == 0, grown.stderr
    assert f"storage of {name}: 40 MiB at {storage_root / name} (grown)" in grown.stdout
    grown_usage = volume_usage(settings, name)
    assert grown_usage is not None and grown_usage.capacity_bytes > 32 * MIB
    shrunk = gpupool(env, "account", "set", name, "--storage-quota", "24M")
    assert shrunk.returncode == 1 and "only grows" in shrunk.stderr
    assert json.loads(gpupool(env, "account", "list", "--json").stdout)[0]["storage_quota_bytes"] == 40 * MIB

    # After a reboot (here: unmounted), `storage mount` mounts every volume again, with what it held.
    (storage_root / name / "kept.txt").write_text("still here")
    subprocess.run(["umount", str(storage_root / name)], check=True)
    assert volume_usage(settings, name) is None
    mounted = gpupool(env, "storage", "mount")
    assert mounted.stdout == f"mounted 1 account volume(s): {name}\n"
    assert (storage_root / name / "kept.txt").read_text() == "still here"
    assert gpupool(env, "storage", "sync").stdout.splitlines()[-1] == "changed 0 of 1 account volume(s)"
    assert f"{name}\tquota=40 MiB\tstored=" in gpupool(env, "storage", "usage").stdout
