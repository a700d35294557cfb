"""A spot job of an account whose Slurm association predates spot jobs: Slurm refuses it, and the answer says what to do."""

from __future__ import annotations

from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from bench.support.services import add_account_row, throwaway_slurm_account
from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from tests.conftest import bearer, slurm_cmd

SPOT_HELLO = {"template": "hello", "gpus": 1, "params": {"seconds": 0}, "preemptible": True}


def test_a_spot_job_of_an_account_made_before_spot_jobs_says_how_to_enable_them(
    client: FlaskClient, settings: Settings, slurm: SlurmClient, session_factory: sessionmaker
) -> None:
    with throwaway_slurm_account(slurm, "prespot") as account:
        add_account_row(session_factory, account)
        headers = bearer(settings, account)
        # What `gpupool account create` left before spot jobs existed: QOS normal alone.
        slurm_cmd("sacctmgr", "-i", "modify", "user", "where", f"account={account}", "set", "qos=normal", "defaultqos=normal")
        refused = client.post("/submit", headers=headers, json=SPOT_HELLO)
        assert refused.status_code == 422, refused.get_data(as_text=True)
        body = refused.get_json()
        assert body["error"] == "spot_not_enabled"
        assert f"gpupool account create {account}" in body["message"]
        assert "Invalid qos specification" in body["message"]  # Slurm's own words, kept
        assert slurm_cmd("squeue", "-h", f"--account={account}").strip() == ""
        # The dry run asks the same sbatch (with --test-only) and answers the same.
        quoted = client.post("/quote", headers=headers, json=SPOT_HELLO)
        assert quoted.status_code == 422, quoted.get_data(as_text=True)
        assert quoted.get_json()["error"] == "spot_not_enabled"
        assert f"gpupool account create {account}" in quoted.get_json()["message"]
        # A full-price job of the same account is Slurm's to refuse or take as before.
        assert client.post("/submit", headers=headers, json={**SPOT_HELLO, "preemptible": False}).status_code == 201
        # Nothing was kept: the same request goes through once the operator has run the command.
        slurm.ensure_account(account, 4, f"{settings.tenant_user_prefix}{account}", max_submit_jobs=settings.max_submit_jobs)
        accepted = client.post("/submit", headers=headers, json=SPOT_HELLO)
        assert accepted.status_code == 201, accepted.get_data(as_text=True)
        assert accepted.get_json()["preemptible"] is True
