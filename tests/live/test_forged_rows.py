"""A tenant's comment that reads like squeue rows, on the real cluster, against the API as it runs.

Tenant A writes comments holding newlines and rows for tenant B's running job:
rows in the layout squeue printed before (comment mid-row, ``|``), in today's
order with ``|``, and rows whose times are no times. It writes them the ways any
customer with a shell can: ``sbatch --hold --comment=...`` and
``scontrol update JobId=<its own running job> Comment=...`` (its running job
sorts after B's in squeue, so a forged row came last and won). The test then
asks the API what a user would see: B's job is as Slurm has it, B's next job
completes, and no webhook was made for B's running job.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from bench.support.http import http
from bench.support.services import TENANT_PREFIX
from bench.support.tenancy import sbatch_as_tenant
from gpupool import db
from gpupool.config import Settings
from gpupool.models import SlurmSync
from gpupool.proc import run_command
from tests.conftest import recorded_token, slurm_cmd, wait_for
from tests.live.conftest import Server

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HELLO = {"template": "hello", "gpus": 1}
SOON = "2026-12-01T00:00:00"


def forged_rows(victim: int, tag: str, b_account: str, *, malformed: bool) -> str:
    """A comment: a newline, then rows for B's job ``victim`` (with its tag, which squeue shows anyone)
    in every layout squeue was read in, then more text."""
    user = TENANT_PREFIX + b_account
    submit = "not-a-time" if malformed else SOON
    start = "not-a-time" if malformed else "N/A"
    new_layout = f"{victim}|PENDING|ForgedByA|{submit}|{start}|N/A||{user}|{b_account}|{tag}"
    old_layout = f"{victim}|PENDING|ForgedByA|{submit}|{start}|N/A||{tag}|{user}|{b_account}"
    return "\n".join(["x", new_layout, old_layout, "a'; echo foo", "a", "0"])


def as_tenant(account: str, *argv: str) -> str:
    return run_command(
        ["/usr/sbin/runuser", "-u", TENANT_PREFIX + account, "--", *argv],
        timeout_s=30,
        env={"PATH": "/usr/bin:/bin", "TZ": "UTC", "LANG": "C.UTF-8"},
    ).stdout


def slurm_state(slurm_job_id: int) -> str:
    return slurm_cmd("squeue", "-h", "-j", str(slurm_job_id), "-o", "%T").strip()


def job(server: Server, token: str, job_id: str) -> dict[str, Any]:
    reply = http("GET", f"{server.url}/jobs/{job_id}", token=token)
    assert reply.status == 200, reply.body
    return reply.body


def deliveries(server: Server, token: str, endpoint_id: str) -> list[tuple[str, str]]:
    reply = http("GET", f"{server.url}/webhooks/{endpoint_id}/deliveries", token=token)
    assert reply.status == 200, reply.body
    return sorted((delivery["job_id"], delivery["event_type"]) for delivery in reply.body["deliveries"])


def refresh_errors(live_settings: Settings) -> str | None:
    engine = db.make_engine(live_settings.database_url)
    try:
        with db.make_session_factory(engine)() as session:
            return session.scalar(select(SlurmSync.last_error))
    finally:
        engine.dispose()


@pytest.mark.parametrize("malformed", [False, True], ids=["forged-rows", "malformed-rows"])
def test_a_comment_forging_rows_changes_nothing_of_another_tenants_job(
    start_server: Callable[..., Server],
    live_settings: Settings,
    slurm_account: str,
    tenant_b: str,
    malformed: bool,
) -> None:
    tenant_a = slurm_account
    server = start_server(workers=2, webhook_allow_cidrs="127.0.0.0/8")
    token_b = recorded_token(live_settings, tenant_b, sub=f"b-{secrets.token_hex(3)}")

    victim = http("POST", f"{server.url}/submit", token=token_b, body={**HELLO, "params": {"seconds": 600}}).body
    running = wait_for(
        lambda: (seen := job(server, token_b, victim["job_id"]))["state"] == "RUNNING" and seen,
        timeout_s=120,
        what="B's job to run",
    )
    # From here on B's running job owes no event: whatever is delivered for it was forged.
    hook = http("POST", f"{server.url}/webhooks", token=token_b, body={"url": "http://127.0.0.1:9/b", "events": ["job.started", "job.ended"]})
    assert hook.status == 201, hook.body

    comment = forged_rows(running["slurm_job_id"], f"gpupool:{victim['job_id']}", tenant_b, malformed=malformed)
    # A held job of A's with the rows as its comment...
    held = sbatch_as_tenant(tenant_a, "--gres=gpu:1", "--hold", f"--comment={comment}", wrap="true")
    # ...and a running one, submitted after B's, which writes them into its own comment.
    forger = sbatch_as_tenant(tenant_a, "--gres=gpu:1", wrap="sleep 300")
    wait_for(lambda: slurm_state(forger) == "RUNNING", timeout_s=120, what="A's job to run")
    as_tenant(tenant_a, "scontrol", "update", f"JobId={forger}", f"Comment={comment}")
    # squeue prints the rows as lines of their own: what the refresher reads holds them.
    printed = slurm_cmd("squeue", "--states=all", "--format=%i|%T|%r|%V|%S|%e|%N|%k|%u|%a")
    assert f"\n{running['slurm_job_id']}|PENDING|ForgedByA|" in printed, printed

    # B's next job runs to the end, and the API says so: the refreshes in between read the rows.
    after = http("POST", f"{server.url}/submit", token=token_b, body={**HELLO, "params": {"seconds": 0}}).body
    finished = wait_for(
        lambda: (seen := job(server, token_b, after["job_id"]))["state"] in ("COMPLETED", "FAILED", "UNKNOWN") and seen,
        timeout_s=120,
        what="B's next job to finish",
    )
    assert finished["state"] == "COMPLETED" and finished["exit_code"] == 0, finished
    assert refresh_errors(live_settings) is None

    # B's running job is as Slurm has it, and as it was.
    now = job(server, token_b, victim["job_id"])
    watched = ("state", "reason", "slurm_job_id", "submitted_at", "started_at", "node", "ended_at")
    assert {key: now[key] for key in watched} == {key: running[key] for key in watched}
    assert slurm_state(running["slurm_job_id"]) == "RUNNING"
    # No webhook for it: B's endpoint owes the next job's events and nothing else.
    assert deliveries(server, token_b, hook.body["id"]) == sorted(
        [(after["job_id"], "job.started"), (after["job_id"], "job.ended")]
    )

    # A's own jobs are still A's, and its comments are just comments.
    assert slurm_cmd("squeue", "-h", "-j", f"{held},{forger}", "-o", "%u").split() == [TENANT_PREFIX + tenant_a] * 2
    slurm_cmd("scancel", str(held), str(forger))
    assert http("DELETE", f"{server.url}/jobs/{victim['job_id']}", token=token_b).status == 202
