"""``gpupool token create|list|revoke`` and ``account disable|enable``, run as the operator runs them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jwt
import pytest
from flask.testing import FlaskClient

from gpupool import db
from gpupool.clock import FrozenClock
from gpupool.config import Settings
from gpupool.models import Account
from gpupool.slurm.client import SlurmClient
from tests.conftest import (
    JWT_SECRET,
    REPO,
    SUITE_NOW,
    add_account_row,
    base_settings,
    sacct_row,
    slurm_cmd,
    throwaway_slurm_account,
    wait_for,
)

GPUPOOL = str(Path(sys.executable).parent / "gpupool")
HELLO = {"template": "hello", "gpus": 1, "params": {"message": "hi", "seconds": 0}}


@dataclass
class Deployment:
    """A migrated SQLite database holding ``account``, and the API in front of it."""

    settings: Settings
    account: str
    api: FlaskClient

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        environment = {
            "PATH": "/usr/bin:/bin",
            "GPUPOOL_DATABASE_URL": self.settings.database_url,
            "GPUPOOL_JWT_SECRET": JWT_SECRET,
            "GPUPOOL_TEMPLATES_DIR": str(REPO / "slurm_templates"),
            "GPUPOOL_JOB_ROOT": self.settings.job_root,
            "GPUPOOL_RUNAS_SOCKET": self.settings.runas_socket,
            **{f"GPUPOOL_{name.upper()}": value for name, value in env.items()},
        }
        return subprocess.run([GPUPOOL, *args], env=environment, capture_output=True, text=True, timeout=120, check=False)

    def token(self, *args: str) -> str:
        created = self.cli("token", "create", "--account", self.account, *args)
        assert created.returncode == 0, created.stderr
        return created.stdout.strip()

    def status(self, token: str) -> tuple[int, str | None]:
        response = self.api.get("/jobs", headers={"Authorization": f"Bearer {token}"})
        return response.status_code, (response.get_json() or {}).get("error")


def deployment(tmp_path: Path, account: str, *, tenant: bool, **overrides: str) -> Deployment:
    """``tenant``: the account has a Unix user and a Slurm account, so it can run jobs."""
    from api import create_app

    url = f"sqlite:///{tmp_path}/tokens.db"
    engine = db.make_engine(url)
    db.upgrade(engine)
    sessions = db.make_session_factory(engine)
    if tenant:
        add_account_row(sessions, account)
    else:
        with sessions() as session, session.begin():
            session.add(Account(name=account))
    engine.dispose()
    # No token cache: the API sees each CLI change on its very next request.
    settings = base_settings(database_url=url, token_check_cache_s=0, **overrides)
    return Deployment(settings, account, create_app(settings, clock=FrozenClock(SUITE_NOW)).test_client())


@pytest.fixture
def tokens_db(tmp_path: Path) -> Deployment:
    """Only the database is needed: the account never runs a job."""
    return deployment(tmp_path, "acme", tenant=False, job_root=str(tmp_path / "jobs"))


@pytest.fixture
def pending_account(slurm: SlurmClient) -> Iterator[str]:
    """A Slurm account that may hold no GPU, so every job it submits stays PENDING."""
    with throwaway_slurm_account(slurm, "d", gpu_limit=0) as name:
        yield name


@pytest.fixture
def held_jobs_db(tmp_path: Path, pending_account: str, job_root: Path, runas_socket: str) -> Deployment:
    return deployment(tmp_path, pending_account, tenant=True, job_root=str(job_root), runas_socket=runas_socket)


def jti_of(token: str) -> str:
    return jwt.decode(token, options={"verify_signature": False})["jti"]


def listed(tokens_db: Deployment) -> dict[str, dict[str, str]]:
    """``token list`` parsed: jti -> its key=value columns."""
    result = tokens_db.cli("token", "list", "--account", tokens_db.account)
    assert result.returncode == 0, result.stderr
    rows = {}
    for line in result.stdout.splitlines():
        jti, *columns = line.split("\t")
        rows[jti] = dict(column.split("=", 1) for column in columns)
    return rows


def test_create_prints_only_a_token_the_api_accepts(tokens_db: Deployment) -> None:
    created = tokens_db.cli("token", "create", "--user", "ops", "--account", "acme", "--admin", "--ttl", "120")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert created.stdout == token + "\n" and created.stderr == ""
    claims = jwt.decode(token, JWT_SECRET, algorithms=["HS256"], audience="gpupool")
    assert (claims["sub"], claims["account"], claims["role"], claims["exp"] - claims["iat"]) == ("ops", "acme", "admin", 120)
    assert tokens_db.status(token) == (200, None)


def test_create_refuses_an_account_that_does_not_exist(tokens_db: Deployment) -> None:
    refused = tokens_db.cli("token", "create", "--user", "u", "--account", "ghost")
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == "gpupool: error: no account 'ghost'; create it with `gpupool account create ghost`\n"


def test_create_refuses_a_ttl_over_the_ceiling(tokens_db: Deployment) -> None:
    over = tokens_db.cli("token", "create", "--user", "u", "--account", "acme", "--ttl", str(90 * 86400 + 1))
    assert (over.returncode, over.stdout) == (1, "")
    assert "--ttl 7776001 is longer than the ceiling of 7776000 seconds (GPUPOOL_JWT_MAX_TTL_S)" in over.stderr
    assert tokens_db.cli("token", "create", "--user", "u", "--account", "acme", "--ttl", str(90 * 86400)).returncode == 0

    lowered = tokens_db.cli("token", "create", "--user", "u", "--account", "acme", "--ttl", "7200", jwt_max_ttl_s="3600")
    assert lowered.returncode == 1 and "ceiling of 3600 seconds" in lowered.stderr
    assert len(listed(tokens_db)) == 1  # refusals record nothing


def test_list_and_revoke(tokens_db: Deployment) -> None:
    kept, leaked = tokens_db.token("--user", "alice"), tokens_db.token("--user", "bob", "--ttl", "60")
    rows = listed(tokens_db)
    assert rows.keys() == {jti_of(kept), jti_of(leaked)}
    assert rows[jti_of(leaked)]["user"] == "bob" and rows[jti_of(leaked)]["role"] == "customer"
    assert {row["state"] for row in rows.values()} == {"active"} and {row["revoked"] for row in rows.values()} == {"-"}

    revoked = tokens_db.cli("token", "revoke", jti_of(leaked), "--reason", "pasted in a chat")
    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout == f"token {jti_of(leaked)} revoked; the API refuses it within 5 s\n"
    assert tokens_db.status(leaked) == (401, "token_revoked")
    assert tokens_db.status(kept) == (200, None)
    after = listed(tokens_db)[jti_of(leaked)]
    assert after["state"] == "revoked" and after["revoked"] != "-"

    again = tokens_db.cli("token", "revoke", jti_of(leaked))
    assert again.returncode == 0 and again.stdout == f"token {jti_of(leaked)} was already revoked at {after['revoked']}\n"

    unknown = tokens_db.cli("token", "revoke", "0" * 32)
    assert unknown.returncode == 1
    assert "no token with id '00000000000000000000000000000000'" in unknown.stderr


def test_list_refuses_an_unknown_account(tokens_db: Deployment) -> None:
    result = tokens_db.cli("token", "list", "--account", "ghost")
    assert result.returncode == 1 and "no account 'ghost'" in result.stderr


def test_disabled_account_gets_401_and_no_new_tokens_until_enabled(tokens_db: Deployment) -> None:
    token = tokens_db.token("--user", "alice")
    disabled = tokens_db.cli("account", "disable", "acme", "--keep-jobs")
    assert disabled.returncode == 0, disabled.stderr
    assert tokens_db.status(token) == (401, "account_disabled")
    refused = tokens_db.cli("token", "create", "--user", "alice", "--account", "acme")
    assert refused.returncode == 1 and "account 'acme' is disabled" in refused.stderr
    assert "is disabled since" in tokens_db.cli("token", "list", "--account", "acme").stderr

    enabled = tokens_db.cli("account", "enable", "acme")
    assert enabled.returncode == 0 and "enabled" in enabled.stdout
    assert tokens_db.status(token) == (200, None)
    assert tokens_db.cli("account", "disable", "ghost").returncode == 1


def submit_pending(held_jobs_db: Deployment) -> int:
    token = held_jobs_db.token("--user", "alice")
    created = held_jobs_db.api.post("/submit", headers={"Authorization": f"Bearer {token}"}, json=HELLO)
    assert created.status_code == 201, created.get_json()
    slurm_job_id = created.get_json()["slurm_job_id"]
    state = slurm_cmd("squeue", "-h", "-j", str(slurm_job_id), "-o", "%T").strip()
    assert state == "PENDING"
    return slurm_job_id


def test_disable_cancels_the_accounts_queued_jobs(held_jobs_db: Deployment) -> None:
    slurm_job_id = submit_pending(held_jobs_db)
    disabled = held_jobs_db.cli("account", "disable", held_jobs_db.account)
    assert disabled.returncode == 0, disabled.stderr
    assert "its pending and running jobs are cancelled" in disabled.stdout

    def queue_is_empty() -> bool:
        return not slurm_cmd("squeue", "-h", f"--account={held_jobs_db.account}", "-t", "PENDING,RUNNING,COMPLETING").strip()

    wait_for(queue_is_empty, timeout_s=30, what="the account's jobs to leave the queue")
    wait_for(
        lambda: sacct_row(slurm_job_id, "JobID,State").get("State", "").startswith("CANCELLED"),
        timeout_s=30,
        what=f"sacct to record job {slurm_job_id} as CANCELLED",
    )


def test_disable_with_keep_jobs_leaves_them_queued(held_jobs_db: Deployment) -> None:
    slurm_job_id = submit_pending(held_jobs_db)
    disabled = held_jobs_db.cli("account", "disable", held_jobs_db.account, "--keep-jobs")
    assert disabled.returncode == 0, disabled.stderr
    assert "its jobs are left in the queue" in disabled.stdout
    assert slurm_cmd("squeue", "-h", "-j", str(slurm_job_id), "-o", "%T").strip() == "PENDING"
