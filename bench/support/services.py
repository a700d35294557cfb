"""Throwaway PostgreSQL databases and Slurm accounts on the real local services, and polling."""

from __future__ import annotations

import os
import pwd
import random
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker

from bench.support.tenancy import TENANT_PREFIX
from gpupool import db
from gpupool.models import Account
from gpupool.proc import run_command
from gpupool.slurm.client import SlurmClient
from gpupool.slurm.parse import parse_elapsed
from gpupool.slurm.tenants import Tenant, ensure_member_user, ensure_tenant_user, remove_member_user, remove_tenant_user

PG_ADMIN_URL = os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

T = TypeVar("T")


def wait_for(probe: Callable[[], T], *, timeout_s: float = 60, interval_s: float = 0.5, what: str = "condition") -> T:
    """Poll ``probe`` until it returns something truthy; fail with the last value seen."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last value: {last!r}")


def slurm_cmd(*argv: str, check: bool = True) -> str:
    env = {"PATH": "/usr/bin:/bin", "TZ": "UTC", "LANG": "C.UTF-8"}
    return run_command(list(argv), timeout_s=30, env=env, check=check).stdout


def create_database(name: str) -> str:
    admin = create_engine(db.normalize_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    engine = db.make_engine(url)
    db.upgrade(engine)
    engine.dispose()
    return url


def drop_database(name: str) -> None:
    admin = create_engine(db.normalize_url(PG_ADMIN_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


SlurmCommand = Callable[..., str]


def cancel_account_jobs(account: str, *, run: SlurmCommand = slurm_cmd, timeout_s: float = 60) -> None:
    """scancel the account's jobs as root and wait until the queue ``run`` talks to holds none."""
    run("scancel", f"--account={account}", check=False)

    def drained() -> bool:
        return not run("squeue", "-h", f"--account={account}", "-t", "PENDING,RUNNING,COMPLETING").strip()

    wait_for(drained, timeout_s=timeout_s, what=f"jobs of {account} to leave the queue")


def run_seconds(slurm_job_id: int, *, run: SlurmCommand = slurm_cmd) -> int:
    """How long the job's current run has run, as slurmctld counts it (scontrol's RunTime=[D-]HH:MM:SS)."""
    words = dict(word.partition("=")[::2] for word in run("scontrol", "--oneliner", "show", "job", str(slurm_job_id)).split()
                 if "=" in word)
    return parse_elapsed(words.get("RunTime", "00:00:00"))


def start_requeued_now(slurm_job_id: int, *, run: SlurmCommand = slurm_cmd, timeout_s: float = 60) -> None:
    """Wait for a requeued job to pend again, then bring its begin time forward, as an operator may.

    Slurm holds a requeued job back (BeginTime about two minutes on); the tests that requeue need not wait it out.
    """
    wait_for(lambda: "JobState=PENDING" in run("scontrol", "--oneliner", "show", "job", str(slurm_job_id)),
             timeout_s=timeout_s, interval_s=0.2, what=f"requeued job {slurm_job_id} to pend")
    run("scontrol", "update", f"jobid={slurm_job_id}", "starttime=now")


@contextmanager
def throwaway_slurm_account(
    slurm: SlurmClient, prefix: str, gpu_limit: int = 4, *, run: SlurmCommand = slurm_cmd, drain_timeout_s: float = 60,
    max_submit_jobs: int | None = None,
) -> Iterator[str]:
    """A new Slurm account with its own tenant user; its jobs are cancelled and both deleted afterwards.

    ``run`` runs Slurm's commands against the cluster ``slurm`` submits to (the multinode suite passes its own).
    ``max_submit_jobs``: the account's job cap (GrpSubmitJobs); the site's default when None.
    """
    name = f"{prefix}{secrets.token_hex(4)}"
    # A random uid: test sessions running side by side would race for the lowest free one.
    settings = slurm.settings
    uid = random.randint(settings.tenant_uid_min + 50_000, settings.tenant_uid_max)
    tenant = ensure_tenant_user(settings, name, uid=uid)
    slurm.ensure_account(
        name, gpu_limit, tenant.user,
        max_submit_jobs=settings.max_submit_jobs if max_submit_jobs is None else max_submit_jobs,
    )
    try:
        yield name
    finally:
        cancel_account_jobs(name, run=run, timeout_s=drain_timeout_s)
        # Accounts with job records may be kept by slurmdbd; harmless.
        run("sacctmgr", "-i", "delete", "account", name, check=False)
        remove_tenant_user(settings, name)


@contextmanager
def throwaway_member_user(slurm: SlurmClient, account: str, *, run: SlurmCommand = slurm_cmd) -> Iterator[Tenant]:
    """A member's own Unix and Slurm user of ``account`` (a throwaway one), as `gpupool member migrate` makes it.

    Inside ``throwaway_slurm_account``: the account's group outlives its members' users only so long.
    """
    settings = slurm.settings
    uid = random.randint(settings.tenant_uid_min + 50_000, settings.tenant_uid_max)
    tenant = ensure_member_user(settings, account, uid)
    try:
        slurm.ensure_member_user(account, tenant.user)
        yield tenant
    finally:
        run("scancel", f"--user={tenant.user}", check=False)
        run("sacctmgr", "-i", "delete", "user", f"name={tenant.user}", check=False)
        remove_member_user(tenant.user)


def add_account_row(session_factory: sessionmaker, name: str) -> None:
    """The database row of an account whose tenant user exists (throwaway_slurm_account)."""
    user = TENANT_PREFIX + name
    with session_factory() as session, session.begin():
        session.add(Account(name=name, gpu_limit=4, unix_user=user, unix_uid=pwd.getpwnam(user).pw_uid))
