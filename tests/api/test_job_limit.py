"""An account's cap on jobs pending or running: Slurm's GrpSubmitJobs refuses past it, and the API says so with 409.

The cap is Slurm's, so a tenant's own sbatch meets it too (tests/live/test_slurm_limits.py);
here the API's answer: 409 ``job_limit_reached`` with the figures, for a single job and for
an array whose tasks would pass it, and nothing left behind.
"""

from __future__ import annotations

from flask.testing import FlaskClient
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from bench.support.services import add_account_row, throwaway_slurm_account
from gpupool.config import Settings
from gpupool.models import Account, Job
from gpupool.slurm.client import SlurmClient
from tests.conftest import bearer, slurm_cmd

CAP = 2
# Long enough to stay in the queue for the whole test; the account's jobs are cancelled afterwards.
WAITING = {"template": "hello", "gpus": 1, "params": {"seconds": 600}}


def queued(account: str) -> list[str]:
    return slurm_cmd("squeue", "-h", "-r", f"--account={account}", "-o", "%i").split()


def test_past_its_job_cap_an_account_gets_409_and_nothing_is_kept(
    client: FlaskClient, settings: Settings, slurm: SlurmClient, session_factory: sessionmaker
) -> None:
    with throwaway_slurm_account(slurm, "cap", max_submit_jobs=CAP) as account:
        add_account_row(session_factory, account)
        with session_factory() as session, session.begin():
            session.get_one(Account, account).max_submit_jobs = CAP
        headers = bearer(settings, account)
        for _ in range(CAP):
            accepted = client.post("/submit", headers=headers, json=WAITING)
            assert accepted.status_code == 201, accepted.get_data(as_text=True)
        assert len(queued(account)) == CAP

        refused = client.post("/submit", headers=headers, json=WAITING)
        assert refused.status_code == 409, refused.get_data(as_text=True)
        body = refused.get_json()
        assert body["error"] == "job_limit_reached"
        assert (body["limit"], body["in_use"], body["asked"]) == (CAP, CAP, 1)
        assert f"at most {CAP} jobs pending or running" in body["message"]

        # An array counts task by task, as Slurm counts it.
        array = client.post("/submit", headers=headers, json={**WAITING, "array": {"count": 3}})
        assert array.status_code == 409, array.get_data(as_text=True)
        assert array.get_json()["asked"] == 3

        # Slurm holds no more than the cap, and the database keeps no row of a refused submit.
        assert len(queued(account)) == CAP
        with session_factory() as session:
            assert session.scalar(select(func.count()).select_from(Job).where(Job.account == account)) == CAP
