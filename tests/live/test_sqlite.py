"""The `make run` configuration: SQLite instead of PostgreSQL, same behaviour."""

from __future__ import annotations

from pathlib import Path

from gpupool import db
from gpupool.clock import FrozenClock
from gpupool.models import Account
from tests.conftest import SUITE_NOW, base_settings, bearer, sacct_row, utc, wait_for_state


def test_submit_and_follow_a_job_on_sqlite(tmp_path: Path, slurm_account: str, job_root: Path, runas_socket: str) -> None:
    from api import create_app

    url = f"sqlite:///{tmp_path}/gpupool.db"
    engine = db.make_engine(url)
    db.upgrade(engine)
    with db.make_session_factory(engine)() as session, session.begin():
        session.add(Account(name=slurm_account, gpu_limit=4))
    settings = base_settings(database_url=url, job_root=str(job_root), runas_socket=runas_socket)
    client = create_app(settings, clock=FrozenClock(SUITE_NOW)).test_client()
    headers = bearer(settings, slurm_account)

    created = client.post("/submit", headers=headers, json={"template": "hello", "gpus": 1, "params": {"message": "sqlite"}})
    assert created.status_code == 201, created.get_json()
    done = wait_for_state(client, created.get_json()["job_id"], headers, {"COMPLETED"})
    assert done["exit_code"] == 0
    assert utc(done["ended_at"]).tzinfo is not None
    record = sacct_row(done["slurm_job_id"], "Account,User")
    assert (record["Account"], record["User"]) == (slurm_account, "gp-" + slurm_account)
    assert "sqlite" in client.get(f"/jobs/{done['job_id']}/logs", headers=headers).get_data(as_text=True)
