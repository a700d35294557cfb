"""The operator's command line, against real Slurm accounting and a real database."""

from __future__ import annotations

import grp
import json
import pwd
import secrets
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.support.services import TENANT_PREFIX
from bench.support.tenancy import SERVICE_USER
from gpupool import db
from gpupool.config import Settings
from gpupool.models import Account
from gpupool.tokens import verify_token
from tests.conftest import JWT_SECRET, REPO, base_settings, slurm_cmd

GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def run_cli(
    *args: str, database_url: str, job_root: Path | None = None, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "GPUPOOL_DATABASE_URL": database_url,
        "GPUPOOL_JWT_SECRET": JWT_SECRET,
        "GPUPOOL_TEMPLATES_DIR": str(REPO / "slurm_templates"),
        "GPUPOOL_SERVICE_GROUP": SERVICE_USER,
    }
    if job_root is not None:
        env["GPUPOOL_JOB_ROOT"] = str(job_root)
    env.update(extra_env or {})
    return subprocess.run([GPUPOOL, *args], env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/cli.db"


@pytest.fixture
def new_account() -> Iterator[str]:
    name = f"c{secrets.token_hex(4)}"
    yield name
    slurm_cmd("sacctmgr", "-i", "delete", "account", name, check=False)
    slurm_cmd("/usr/sbin/userdel", TENANT_PREFIX + name, check=False)
    slurm_cmd("/usr/sbin/groupdel", TENANT_PREFIX + name, check=False)


def test_account_create_makes_the_tenant_user_slurm_association_and_gpu_limit(
    sqlite_url: str, new_account: str, job_root: Path
) -> None:
    assert run_cli("db", "upgrade", database_url=sqlite_url).returncode == 0
    created = run_cli("account", "create", new_account, "--gpu-limit", "2", database_url=sqlite_url, job_root=job_root)
    assert created.returncode == 0, created.stderr
    assert f"account {new_account} created" in created.stdout
    tenant = TENANT_PREFIX + new_account
    user = pwd.getpwnam(tenant)
    assert 200_000 <= user.pw_uid <= 299_999 and user.pw_shell == "/usr/sbin/nologin"
    assert tenant in grp.getgrnam("gpupool-tenants").gr_mem
    # The account's folder is root's: each of its users (the account's, its members') passes through to their own job folders.
    folder = (job_root / new_account).stat()
    assert (folder.st_uid, folder.st_gid, stat.S_IMODE(folder.st_mode)) == (0, 0, 0o711)

    # The tenant alone has an association: not root, not the service.
    rows = slurm_cmd("sacctmgr", "-n", "-P", "show", "association", "where", f"account={new_account}", "format=account,user,grptres").split()
    # One row each per cluster slurmdbd serves (the multinode test cluster may be one).
    assert set(rows) == {f"{new_account}||gres/gpu=2", f"{new_account}|{tenant}|"}
    listed = json.loads(run_cli("account", "list", "--json", database_url=sqlite_url).stdout)
    assert {"account": new_account, "unix_user": tenant, "unix_uid": user.pw_uid, "members": []} in listed

    # The account's job cap: the site's default, then its own.
    association = ("sacctmgr", "-n", "-P", "show", "association", "where", f"account={new_account}", "format=account,user,grptres,grpsubmit")
    assert f"{new_account}||gres/gpu=2|{Settings.max_submit_jobs}" in slurm_cmd(*association).split()
    again = run_cli(
        "account", "create", new_account, "--gpu-limit", "3", "--max-submit-jobs", "50", database_url=sqlite_url, job_root=job_root
    )
    assert again.returncode == 0 and "updated" in again.stdout and "GrpSubmitJobs=50" in again.stdout
    assert f"{new_account}||gres/gpu=3|50" in slurm_cmd(*association).split()
    assert pwd.getpwnam(tenant).pw_uid == user.pw_uid  # same user, same uid
    listed = run_cli("account", "list", database_url=sqlite_url)
    assert f"{new_account}\tgpu_limit=3\tcredit=-\tmonthly_limit=-\tmax_submit_jobs=50" in listed.stdout.splitlines()
    # What an upgrade (or a new site default) runs: every account's association from the database.
    slurm_cmd("sacctmgr", "-i", "modify", "account", "where", f"name={new_account}", "set", "GrpSubmitJobs=-1")
    synced = run_cli("account", "sync", database_url=sqlite_url, job_root=job_root)
    assert synced.returncode == 0, synced.stderr
    assert synced.stdout.splitlines() == [f"account {new_account}: GrpTRES=gres/gpu=3, GrpSubmitJobs=50", "changed 1 of 1 account(s) in Slurm"]
    assert f"{new_account}||gres/gpu=3|50" in slurm_cmd(*association).split()
    assert run_cli("account", "sync", database_url=sqlite_url).stdout == "changed 0 of 1 account(s) in Slurm\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("account", "create", "Bad Name"), "not a valid account name"),
        (("account", "create", "ok", "--gpu-limit", "-1"), "must be 0 or more"),
        (("account", "create", "ok", "--max-submit-jobs", "0"), "must be between 1 and 1000000"),
        (("token", "create", "--account", "acme"), "--user"),
        (("frobnicate",), "invalid choice"),
    ],
)
def test_bad_command_lines_exit_2_with_a_message(sqlite_url: str, args: tuple[str, ...], message: str) -> None:
    result = run_cli(*args, database_url=sqlite_url)
    assert result.returncode == 2
    assert message in result.stderr


def test_the_operators_calendar_decisions_read_the_calendar_clock(sqlite_url: str) -> None:
    # The report's default window is "this month": the month of calendar_now when it is set
    # (make test-calendar, drills), whatever today is.
    assert run_cli("db", "upgrade", database_url=sqlite_url).returncode == 0
    env = {"GPUPOOL_CALENDAR_NOW": "2031-07-15T12:00:00Z"}
    report = run_cli("report", "--format", "json", database_url=sqlite_url, extra_env=env)
    assert report.returncode == 0, report.stderr
    window = json.loads(report.stdout)
    assert (window["since"], window["until"]) == ("2031-07-01T00:00:00Z", "2031-08-01T00:00:00Z")
    refused = run_cli("report", database_url=sqlite_url, extra_env={"GPUPOOL_CALENDAR_NOW": "next tuesday"})
    assert refused.returncode != 0 and "calendar_now must be an ISO 8601 instant" in refused.stderr


def test_commands_refuse_an_unmigrated_database(sqlite_url: str) -> None:
    result = run_cli("account", "list", database_url=sqlite_url)
    assert result.returncode == 1
    assert "run `gpupool db upgrade` first" in result.stderr
    assert db.current_revision(db.make_engine(sqlite_url)) is None
    upgraded = run_cli("db", "upgrade", database_url=sqlite_url)
    assert upgraded.returncode == 0 and upgraded.stdout.strip() == f"database at revision {db.head_revision()}"
    assert run_cli("db", "upgrade", database_url=sqlite_url).returncode == 0  # idempotent


def test_token_create_prints_a_verifiable_token(sqlite_url: str) -> None:
    assert run_cli("db", "upgrade", database_url=sqlite_url).returncode == 0
    with db.make_session_factory(db.make_engine(sqlite_url))() as session, session.begin():
        session.add(Account(name="acme"))  # a token needs the database row only
    result = run_cli("token", "create", "--user", "ops", "--account", "acme", "--admin", "--ttl", "120", database_url=sqlite_url)
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    caller = verify_token(base_settings(), token)
    assert (caller.sub, caller.account, caller.role) == ("ops", "acme", "admin")
    import jwt

    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 120
    assert claims["aud"] == "gpupool"


def test_operator_commands_are_in_the_audit_log_under_the_operators_name(sqlite_url: str) -> None:
    assert run_cli("db", "upgrade", database_url=sqlite_url).returncode == 0
    with db.make_session_factory(db.make_engine(sqlite_url))() as session, session.begin():
        session.add(Account(name="acme"))
    token = run_cli("token", "create", "--user", "ops\tx", "--account", "acme", database_url=sqlite_url).stdout.strip()
    caller = verify_token(base_settings(), token)
    assert run_cli("token", "revoke", caller.jti, "--reason", "left", database_url=sqlite_url).returncode == 0
    assert run_cli("price", "set", "rtx4090", "0.0002", "--from", "2026-01-01", database_url=sqlite_url).returncode == 0
    assert run_cli("account", "disable", "acme", "--keep-jobs", database_url=sqlite_url).returncode == 0
    listed = run_cli("audit", "list", "--json", database_url=sqlite_url)
    assert listed.returncode == 0, listed.stderr
    events = json.loads(listed.stdout)
    assert [(e["action"], e["account"], e["target"], e["via"], e["actor"]) for e in events] == [
        ("account.disable", "acme", None, "cli", "operator:root"),
        ("price.set", None, "rtx4090", "cli", "operator:root"),
        ("token.revoke", "acme", caller.jti, "cli", "operator:root"),
        ("token.create", "acme", caller.jti, "cli", "operator:root"),
    ]
    assert events[3]["details"]["subject"] == "ops\tx" and token not in listed.stdout
    assert events[1]["details"] == {"price": "0.0002", "tier": "normal", "from": "2026-01-01T00:00:00Z"}
    # One event per line, whatever a subject holds: the free-form fields are JSON strings.
    lines = run_cli("audit", "list", "--account", "acme", database_url=sqlite_url).stdout.splitlines()
    assert len(lines) == 3 and all(line.count("\t") == 8 for line in lines)


def test_token_create_without_a_secret_fails_clearly(tmp_path: Path) -> None:
    result = subprocess.run(
        [GPUPOOL, "token", "create", "--user", "u", "--account", "acme"],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 1
    assert "GPUPOOL_JWT_SECRET" in result.stderr


def test_serve_runs_the_development_server(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/serve.db"
    assert run_cli("db", "upgrade", database_url=url).returncode == 0
    from tests.live.conftest import free_port, http

    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "GPUPOOL_DATABASE_URL": url, "GPUPOOL_JWT_SECRET": JWT_SECRET,
           "GPUPOOL_TEMPLATES_DIR": str(REPO / "slurm_templates")}
    server = subprocess.Popen([GPUPOOL, "serve", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answers() -> bool:
            try:
                return http("GET", f"http://127.0.0.1:{port}/healthz", timeout_s=2).status == 200
            except OSError:
                return False

        from tests.conftest import wait_for

        wait_for(answers, timeout_s=30, what="gpupool serve to answer")
        ready = http("GET", f"http://127.0.0.1:{port}/readyz")
        assert ready.status == 200 and ready.body["checks"] == {"database": "ok", "slurm": "ok"}
    finally:
        server.terminate()
        server.wait(timeout=15)
