"""Members of one account who do not trust each other, on the real cluster: the kernel and Slurm keep them apart.

Each member who runs jobs has a Unix and Slurm user of their own under the
account's association (``gpupool member migrate``). M1 submits through the API
(run as M1's own user by the real run-as helper); code of M2's, run as M2's uid
with setpriv as a job of theirs would run it, tries M1's job folder, logs and
session secret and M1's job in Slurm, and the test asserts the kernel's and
Slurm's own answers. M2's own sbatch past M2's GPU and monthly limits is held
back by Slurm. Both members' direct jobs are billed to the account, and each
counts in its member's own monthly spend. A job submitted before the migration
runs on as the account's user, followed and cancelled as before.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import pwd
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from bench.support.services import TENANT_PREFIX, slurm_cmd, throwaway_member_user, throwaway_slurm_account
from billing.calendar import period_of
from billing.money import format_nanos
from billing.prices import set_price
from gpupool.config import Settings
from gpupool.models import Account, AccountMember, JobSession, MemberIdentity, MemberSpend
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import parse_delimited
from gpupool.slurm.tenants import Tenant
from tests.billing.conftest import RTX4090_NANOS, LedgerDb, pg_ledger  # noqa: F401 (pg_ledger: a fixture)
from tests.conftest import SUITE_NOW, bearer, create_app_for_tests, wait_for, wait_for_state

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PROXY_KEY = "member-test-proxy-key-" + "q" * 30
APP_COMMAND = 'exec python3 -m http.server --bind 127.0.0.1 "$GPUPOOL_APP_PORT"'
LONG_JOB = {"template": "hello", "gpus": 1, "time_limit_min": 10, "params": {"message": "m1", "seconds": 600}}


@dataclass(frozen=True)
class Team:
    account: str
    m1: Tenant
    m2: Tenant


@pytest.fixture(scope="module")
def team(slurm: SlurmClient) -> Iterator[Team]:
    """An account of the module's own with two members' users, as `gpupool member migrate` makes them."""
    with throwaway_slurm_account(slurm, "mem") as account:
        with throwaway_member_user(slurm, account) as m1, throwaway_member_user(slurm, account) as m2:
            yield Team(account, m1, m2)


def as_user(user: Tenant | str, *argv: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``argv`` as that Unix user with its own groups, as code in one of its jobs would run it."""
    name = user if isinstance(user, str) else user.user
    entry = pwd.getpwnam(name)
    return subprocess.run(
        ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--", *argv],
        capture_output=True, text=True, timeout=timeout_s, check=False, cwd="/tmp",
        env={"PATH": "/usr/bin:/bin", "TZ": "UTC", "LANG": "C.UTF-8"},
    )


def enrol(session_factory: sessionmaker, team: Team, *, identities: bool = True) -> None:
    """The account's row, ada its admin, m1 and m2 members with the users the fixture made (committed for the test)."""
    now = SUITE_NOW
    user = TENANT_PREFIX + team.account
    with session_factory() as session, session.begin():
        session.add(Account(name=team.account, gpu_limit=4, unix_user=user, unix_uid=pwd.getpwnam(user).pw_uid))
        session.flush()
        for subject, role in (("ada", "admin"), ("m1", "member"), ("m2", "member")):
            session.add(AccountMember(account=team.account, subject=subject, role=role, created_at=now, updated_at=now))
        set_price(session, "rtx4090", RTX4090_NANOS, now - dt.timedelta(days=400))
    if identities:
        add_identities(session_factory, team)


def add_identities(session_factory: sessionmaker, team: Team) -> None:
    """What `gpupool member migrate` records for m1 and m2."""
    with session_factory() as session, session.begin():
        for subject, tenant in (("m1", team.m1), ("m2", team.m2)):
            session.add(MemberIdentity(account=team.account, subject=subject, unix_user=tenant.user, unix_uid=tenant.uid, created_at=SUITE_NOW))


@pytest.fixture
def app(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker) -> Flask:
    return create_app_for_tests(settings.replace(session_proxy_key=PROXY_KEY), slurm, session_factory)


@pytest.fixture
def members(client: FlaskClient, settings: Settings, session_factory: sessionmaker, team: Team) -> Iterator[dict[str, dict[str, str]]]:
    enrol(session_factory, team)
    yield {name: bearer(settings, team.account, sub=name) for name in ("ada", "m1", "m2")}
    slurm_cmd("scancel", f"--account={team.account}", check=False)


def slurm_job(job_id: int) -> dict[str, str]:
    text = slurm_cmd("scontrol", "--oneliner", "show", "job", str(job_id))
    return dict(word.split("=", 1) for word in text.split() if "=" in word)


def test_another_member_gets_nothing_of_a_members_job_from_the_kernel_or_slurm(
    client: FlaskClient, members: dict[str, dict[str, str]], team: Team, job_root: Path, session_factory: sessionmaker
) -> None:
    session_job = client.post(
        "/submit", headers=members["m1"], json={"template": "webapp", "gpus": 1, "params": {"command": APP_COMMAND}}
    ).get_json()
    long_job = client.post("/submit", headers=members["m1"], json=LONG_JOB).get_json()
    for job in (session_job, long_job):
        assert job.get("slurm_job_id"), job
    # Submitted as M1's own Slurm user, under the account's association.
    detail = slurm_job(long_job["slurm_job_id"])
    assert (detail["UserId"].split("(")[0], detail["Account"]) == (team.m1.user, team.account)

    session_dir = job_root / team.account / session_job["job_id"]
    job_dir = job_root / team.account / long_job["job_id"]
    with session_factory() as session:
        secret = session.get(JobSession, session_job["job_id"]).secret
    # The test can fail: M1 reads their own secret, as the job's shim does.
    own = as_user(team.m1, "cat", str(session_dir / "session.secret"))
    assert own.returncode == 0 and own.stdout.strip() == secret, own.stderr

    # M2, and the account's own user (which every member ran as before), get the kernel's refusal.
    for intruder in (team.m2, TENANT_PREFIX + team.account):
        for argv in (
            ("cat", str(session_dir / "session.secret")),
            ("ls", str(session_dir)),
            ("cat", str(job_dir / "stdout.log")),
            ("cat", str(job_dir / "job.sbatch")),
            ("touch", str(job_dir / "planted")),
            ("ls", str(job_root / team.account)),
        ):
            refused = as_user(intruder, *argv)
            assert refused.returncode != 0 and "Permission denied" in refused.stderr, (intruder, argv, refused.stderr)
        # And Slurm's: not their job, and they are no coordinator of the account.
        cancel = as_user(intruder, "scancel", str(long_job["slurm_job_id"]))
        assert cancel.returncode != 0 and "Access/permission denied" in cancel.stderr, (intruder, cancel.stderr)
        for change in (("hold",), ("update", f"JobId={long_job['slurm_job_id']}", "TimeLimit=1")):
            argv = ("scontrol", *change, *([str(long_job["slurm_job_id"])] if change == ("hold",) else []))
            refused = as_user(intruder, *argv)
            assert refused.returncode != 0, (intruder, argv, refused.stdout)
            assert "Access/permission denied" in refused.stderr or "Invalid user id" in refused.stderr, refused.stderr

    # Slurm confirms nothing moved: M1's job is unheld, with its limit; nothing was planted.
    after = slurm_job(long_job["slurm_job_id"])
    assert after["JobState"] in ("PENDING", "RUNNING") and after["TimeLimit"] == "00:10:00" and after["Priority"] != "0"
    assert not (job_dir / "planted").exists()
    # Why: each job's folder is its member's, with the service's group; the account's folder is root's.
    assert (job_dir.stat().st_uid, oct(job_dir.stat().st_mode & 0o7777)) == (team.m1.uid, "0o710")
    assert (job_dir.parent.stat().st_uid, oct(job_dir.parent.stat().st_mode & 0o7777)) == (0, "0o711")

    # The API keeps its own view: M2 does not see M1's job; the admin reads its log and cancels it,
    # which the run-as helper does as M1's own user.
    assert client.get(f"/jobs/{long_job['job_id']}", headers=members["m2"]).status_code == 404
    assert client.get(f"/jobs/{long_job['job_id']}/logs", headers=members["ada"]).status_code == 200
    assert client.delete(f"/jobs/{long_job['job_id']}", headers=members["ada"]).status_code == 202
    assert wait_for_state(client, long_job["job_id"], members["ada"], {"CANCELLED"})["state"] == "CANCELLED"


def test_a_job_from_before_the_migration_is_still_followed_and_cancelled_as_the_accounts_user(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, team: Team
) -> None:
    enrol(session_factory, team, identities=False)
    before_app = create_app_for_tests(settings.replace(session_proxy_key=PROXY_KEY), slurm, session_factory).test_client()
    token = bearer(settings, team.account, sub="m1")
    old = before_app.post("/submit", headers=token, json=LONG_JOB).get_json()
    assert slurm_job(old["slurm_job_id"])["UserId"].split("(")[0] == TENANT_PREFIX + team.account
    add_identities(session_factory, team)
    # A new worker (no cached standing): m1's next job runs as m1's own user...
    client = create_app_for_tests(settings.replace(session_proxy_key=PROXY_KEY), slurm, session_factory).test_client()
    new = client.post("/submit", headers=token, json=LONG_JOB).get_json()
    assert slurm_job(new["slurm_job_id"])["UserId"].split("(")[0] == team.m1.user
    try:
        # ...while the old one is still followed, and cancelled as the account's user it runs as.
        assert client.get(f"/jobs/{old['job_id']}", headers=token).get_json()["state"] in ("PENDING", "RUNNING")
        assert client.delete(f"/jobs/{old['job_id']}", headers=token).status_code == 202
        assert wait_for_state(client, old["job_id"], token, {"CANCELLED"})["state"] == "CANCELLED"
        assert slurm_job(new["slurm_job_id"])["JobState"] in ("PENDING", "RUNNING")
    finally:
        slurm_cmd("scancel", f"--account={team.account}", check=False)


def grp_limits(account: str, user: str) -> dict[str, str]:
    rows = parse_delimited(slurm_cmd("sacctmgr", "--parsable2", "show", "association", f"account={account}", f"user={user}",
                                     "format=User,GrpTRES,GrpTRESMins"))
    return {"GrpTRES": rows[0]["GrpTRES"], "GrpTRESMins": rows[0]["GrpTRESMins"]}


def direct_sbatch(user: Tenant, account: str, *options: str) -> subprocess.CompletedProcess[str]:
    return as_user(user, "sbatch", "--parsable", f"--account={account}", "--partition=gpu", "--output=/dev/null", *options, "--wrap=sleep 60")


def held_back(submitted: subprocess.CompletedProcess[str], *reasons: str) -> str | None:
    """Slurm's own answer to a job past a limit: refused at submit, or pending for one of ``reasons``; the job id if it pends."""
    if submitted.returncode != 0:
        assert "Job violates accounting/QOS policy" in submitted.stderr, submitted.stderr
        return None
    job_id = submitted.stdout.strip().split(";")[0]
    wait_for(lambda: reason_of(job_id) in {f"PENDING {reason}" for reason in reasons}, what=f"job {job_id} held back for {reasons}")
    return job_id


def reason_of(job_id: str) -> str:
    return slurm_cmd("squeue", "-h", "-j", job_id, "-o", "%T %r", check=False).strip()


def test_a_members_own_sbatch_past_their_gpu_and_monthly_limits_is_held_by_slurm(
    client: FlaskClient, members: dict[str, dict[str, str]], team: Team
) -> None:
    # The admin's change reaches Slurm at once, on M2's own association.
    ten_minutes = format_nanos(10 * 60 * RTX4090_NANOS)
    changed = client.put("/account/members/m2", headers=members["ada"], json={"role": "member", "gpu_limit": 1, "monthly_limit": ten_minutes})
    assert changed.status_code == 200, changed.get_json()
    assert changed.get_json()["unix_user"] == team.m2.user
    assert grp_limits(team.account, team.m2.user) == {"GrpTRES": "gres/gpu=1", "GrpTRESMins": "gres/gpu=10"}
    # M1's are their own: none.
    assert grp_limits(team.account, team.m1.user) == {"GrpTRES": "", "GrpTRESMins": ""}

    # Past the GPU limit: Slurm holds it back, though the account could run it.
    two_gpus = held_back(direct_sbatch(team.m2, team.account, "--gres=gpu:2", "--time=1"), "AssocGrpGRES")
    # Past what is left of the monthly limit: 11 GPU-minutes do not fit in 10.
    too_long = held_back(direct_sbatch(team.m2, team.account, "--gres=gpu:1", "--time=11"), "AssocGrpGRESMinutes")
    # M1, in the same account, is held by none of M2's limits: it runs, or waits for GPUs alone.
    submitted = direct_sbatch(team.m1, team.account, "--gres=gpu:2", "--time=11")
    assert submitted.returncode == 0, submitted.stderr
    m1_job = submitted.stdout.strip().split(";")[0]
    wait_for(lambda: reason_of(m1_job).startswith("RUNNING") or reason_of(m1_job) in ("PENDING Resources", "PENDING Priority"),
             what="M1's job to run or wait for GPUs")
    slurm_cmd("scancel", *(job for job in (two_gpus, too_long, m1_job) if job))

    # Taken out of the account: nothing new of theirs starts, by any path.
    assert client.delete("/account/members/m2", headers=members["ada"]).status_code == 204
    assert grp_limits(team.account, team.m2.user) == {"GrpTRES": "gres/gpu=0", "GrpTRESMins": "gres/gpu=0"}
    refused_or_held = direct_sbatch(team.m2, team.account, "--gres=gpu:1", "--time=1")
    if (left := held_back(refused_or_held, "AssocGrpGRES", "AssocGrpGRESMinutes")) is not None:
        slurm_cmd("scancel", left)


def test_both_members_direct_jobs_are_billed_to_the_account_and_each_to_its_member(
    pg_ledger: LedgerDb, team: Team  # noqa: F811
) -> None:
    user = TENANT_PREFIX + team.account
    with pg_ledger.sessions() as session, session.begin():
        session.merge(Account(name=team.account, gpu_limit=4, unix_user=user, unix_uid=pwd.getpwnam(user).pw_uid))
        session.flush()
        for subject, tenant in (("m1", team.m1), ("m2", team.m2)):
            session.merge(AccountMember(account=team.account, subject=subject, role="member", created_at=SUITE_NOW, updated_at=SUITE_NOW))
            session.merge(MemberIdentity(account=team.account, subject=subject, unix_user=tenant.user, unix_uid=tenant.uid, created_at=SUITE_NOW))
    # Every pass brings the members' Slurm limits to the database's: here, none of their own.
    assert pg_ledger.cli("billing", "run").returncode == 0
    for tenant in (team.m1, team.m2):
        assert grp_limits(team.account, tenant.user) == {"GrpTRES": "", "GrpTRESMins": ""}
    jobs = {}
    for subject, tenant in (("m1", team.m1), ("m2", team.m2)):
        ran = as_user(tenant, "sbatch", "--parsable", "--wait", f"--account={team.account}", "--partition=gpu", "--gres=gpu:1",
                      "--time=1", "--output=/dev/null", "--wrap=sleep 2")
        assert ran.returncode == 0, ran.stderr
        jobs[subject] = ran.stdout.strip().split(";")[0]

    def billed() -> dict[str, dict[str, str]] | None:
        assert pg_ledger.cli("billing", "run").returncode == 0
        invoice = pg_ledger.cli("invoice", "--account", team.account, "--period", period_of(SUITE_NOW), "-o", "-")
        lines = {line["slurm_job_id"]: line for line in csv.DictReader(io.StringIO(invoice.stdout))}
        found = {subject: lines.get(job_id) for subject, job_id in jobs.items()}
        return found if all(line and int(line["gpu_seconds"]) > 0 for line in found.values()) else None  # type: ignore[misc]

    lines = wait_for(billed, timeout_s=120, interval_s=2, what="both members' jobs on the account's invoice")
    assert {line["line_type"] for line in lines.values()} == {"job"}
    # Each direct job counts in its own member's monthly spend, which their Slurm budget is made from.
    with pg_ledger.sessions() as session:
        spent = dict(session.execute(
            select(MemberSpend.subject, MemberSpend.ledger_nanos).where(MemberSpend.account == team.account)
        ).all())
    assert set(spent) == {"m1", "m2"} and all(nanos > 0 for nanos in spent.values()), spent
    pg_ledger.assert_spend_exact()


def test_member_migrate_gives_each_member_who_runs_jobs_a_user_of_their_own(pg_ledger: LedgerDb, slurm: SlurmClient) -> None:  # noqa: F811
    with throwaway_slurm_account(slurm, "mig") as account:
        user = TENANT_PREFIX + account
        subject = f"carol <{secrets.token_hex(2)}>: free text; rm -rf /"  # a subject is data, never a name
        with pg_ledger.sessions() as session, session.begin():
            session.add(Account(name=account, gpu_limit=4, unix_user=user, unix_uid=pwd.getpwnam(user).pw_uid))
            session.flush()
            for who, role in ((subject, "member"), ("vic", "viewer")):
                session.add(AccountMember(account=account, subject=who, role=role, created_at=SUITE_NOW, updated_at=SUITE_NOW))
        made: list[str] = []
        try:
            migrated = pg_ledger.cli("member", "migrate", account)
            with pg_ledger.sessions() as session:
                made = list(session.scalars(select(MemberIdentity.unix_user).where(MemberIdentity.account == account)))
            assert migrated.returncode == 0, migrated.stderr
            assert len(made) == 1, made  # carol, not the viewer
            entry = pwd.getpwnam(made[0])
            assert made[0].startswith(f"gp-{entry.pw_uid}-") and entry.pw_gid == pwd.getpwnam(user).pw_gid
            assert f"runs jobs as Unix user {made[0]}" in migrated.stdout
            listed = json.loads(pg_ledger.cli("account", "list", "--json").stdout)
            assert {"unix_user": made[0], "unix_uid": entry.pw_uid} in next(row["members"] for row in listed if row["account"] == account)
            # Slurm: a user under the account alone, no coordinator.
            rows = slurm_cmd("sacctmgr", "-n", "-P", "show", "association", f"user={made[0]}", "format=account,user").split()
            assert rows and set(rows) == {f"{account}|{made[0]}"}
            coordinators = slurm_cmd("sacctmgr", "-n", "-P", "show", "user", made[0], "withcoord", "format=User,Coordinators")
            assert coordinators.split() == [f"{made[0]}|"], coordinators
            # Idempotent: a second run makes nothing new.
            again = pg_ledger.cli("member", "migrate", account)
            assert again.returncode == 0 and "now runs" not in again.stdout and f"runs jobs as Unix user {made[0]}" in again.stdout
        finally:
            for name in made:
                slurm_cmd("sacctmgr", "-i", "delete", "user", f"name={name}", check=False)
                slurm_cmd("/usr/sbin/userdel", name, check=False)
