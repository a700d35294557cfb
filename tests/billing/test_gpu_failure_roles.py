"""A pass as the billing role credits a run a failed GPU ended and writes the job's end_reason, and no other column of jobs."""

from __future__ import annotations

from sqlalchemy import select

from billing import passes
from gpupool.models import Adjustment, Job
from gpupool.slurm.client import SlurmClient
from tests.billing.test_db_roles import RolesDb, assert_permission_denied, roles_db  # noqa: F401 (the fixture, a database of this module's own)
from tests.billing.test_gpu_failure_credits import Sacct, add_job, utc


def test_the_billing_role_credits_a_gpu_failure_and_sets_the_jobs_end_reason_alone(roles_db: RolesDb) -> None:  # noqa: F811
    roles_db.owner.add_account("acme")
    add_job(roles_db.owner, "job-41", 41)
    billing = roles_db.as_billing()

    report = passes.run_pass(billing.sessions, SlurmClient(billing.settings, runner=Sacct()), billing.settings,
                             now=utc("2026-11-03T12:00:00"))

    assert report.credits == 2
    with roles_db.owner.sessions() as session:
        assert session.scalar(select(Job.end_reason).where(Job.id == "job-41")) == "gpu_failure: Xid 79 on 0000:41:00.0 (node gpu1)"
        assert set(session.scalars(select(Adjustment.kind))) == {"gpu_failure_credit"}
    assert_permission_denied(roles_db.billing_url, "UPDATE jobs SET state = 'COMPLETED'", "jobs")
