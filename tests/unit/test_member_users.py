"""Whom the run-as helper accepts as a member's user of an account: its own checks, on a stand-in user table.

The live side (real users, real Slurm) is tests/live/test_member_isolation.py.
"""

from __future__ import annotations

import grp
import pwd
from collections.abc import Iterator

import pytest

from gpupool.config import Settings
from gpupool.errors import TenantError
from gpupool.slurm.tenants import account_users, lookup_member

SETTINGS = Settings(service_user="gpupool", service_group="gpupool")
TENANTS_GROUP = SETTINGS.tenant_group
# name: (uid, primary gid); acme's group is 200000 (its user's own), beta's 200100.
USERS = {
    "gp-acme": (200000, 200000),
    "gp-beta": (200100, 200100),
    "gp-200001-acme": (200001, 200000),  # a member of acme
    "gp-200002-acme": (200002, 200000),  # another
    "gp-200101-beta": (200101, 200100),  # a member of beta
    "gp-1000-acme": (1000, 200000),  # acme's group, but a uid outside the tenant range
    "gp-200003-acme": (200003, 200000),  # acme's group, not in the tenants group
    "gpupool": (999, 999),
    "root": (0, 0),
}
IN_TENANTS_GROUP = [name for name in USERS if name not in ("gp-200003-acme", "gpupool", "root")]


def _passwd(name: str, uid: int, gid: int) -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", uid, gid, "", "/nonexistent", "/usr/sbin/nologin"))


@pytest.fixture(autouse=True)
def users(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def getpwnam(name: str) -> pwd.struct_passwd:
        if name not in USERS:
            raise KeyError(name)
        return _passwd(name, *USERS[name])

    def getgrnam(name: str) -> grp.struct_group:
        if name != TENANTS_GROUP:
            raise KeyError(name)
        return grp.struct_group((name, "x", 150, list(IN_TENANTS_GROUP)))

    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    monkeypatch.setattr(grp, "getgrnam", getgrnam)
    yield


def test_a_member_user_of_the_account_is_accepted_as_itself() -> None:
    member = lookup_member(SETTINGS, "acme", "gp-200001-acme")
    assert (member.user, member.uid, member.gid, member.account_uid, member.is_member) == ("gp-200001-acme", 200001, 200000, 200000, True)
    # The account's own user, named as a member, is the account's user.
    assert lookup_member(SETTINGS, "acme", "gp-acme").is_member is False


@pytest.mark.parametrize(
    ("user", "why"),
    [
        ("gp-200101-beta", "not a member user of account 'acme'"),  # another account's member
        ("gp-beta", "not a member user of account 'acme'"),  # another account's own user
        ("gp-1000-acme", "outside the tenant range"),
        ("gp-200003-acme", "not in the tenants group"),
        ("gpupool", "outside the tenant range"),  # the service
        ("root", "outside the tenant range"),
        ("gp-404-acme", "has no member user"),
        ("gp-acme; rm -rf /", "not a Unix user name gpupool makes"),
        ("GP-200001-ACME", "not a Unix user name gpupool makes"),
    ],
)
def test_anyone_else_is_refused_whatever_the_caller_says(user: str, why: str) -> None:
    with pytest.raises(TenantError, match=why):
        lookup_member(SETTINGS, "acme", user)


def test_an_account_without_a_tenant_user_has_no_members_either() -> None:
    with pytest.raises(TenantError, match="has no Unix user 'gp-gone'"):
        lookup_member(SETTINGS, "gone", "gp-200001-acme")


def test_the_accounts_users_are_its_own_and_its_members_and_no_one_else() -> None:
    # gp-1000-acme (outside the range) and gp-200003-acme (not a tenant) have acme's group and are still left out.
    assert [user.user for user in account_users(SETTINGS, "acme")] == ["gp-acme", "gp-200001-acme", "gp-200002-acme"]
    assert [user.user for user in account_users(SETTINGS, "beta")] == ["gp-beta", "gp-200101-beta"]
