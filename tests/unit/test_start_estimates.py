"""Start estimates from Slurm's own text: the job-state squeue's START_TIME of pending jobs, and sbatch --test-only.

Provenance (Slurm 22.05.8 on the local one-node cluster, 4 rtx4090, TZ=UTC, backfill):

* ``fixtures/squeue/pending-estimate.txt`` is verbatim
  ``SQUEUE_FORMAT=<queue_format(RECORDED)> squeue --states=all --jobs=11,12``: job 11
  runs on 1 GPU with a 2-minute limit, job 12 asks for all 4 GPUs and pends on
  Resources; once backfill had run, it gave job 12 job 11's end as its start.
  ``start-of-pending.txt`` is ``squeue --start --jobs=12 -o '%i|%S'`` right after.
* ``fixtures/sbatch/test-only.txt`` is ``sbatch --test-only --gres=gpu:4 -t 1 --wrap true``
  (stderr and stdout) at that moment; ``test-only-refused.txt`` the same with gpu:8.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from gpupool.config import Settings
from gpupool.jobstate import JobStateRefresher, SlurmAnswers
from gpupool.models import Job
from gpupool.slurm.client import SlurmClient, parse_queue, parse_will_run
from gpupool.slurm.parse import parse_delimited, parse_time

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = "|5f2a9c7e01bd|"
PENDING_ESTIMATE = (FIXTURES / "squeue" / "pending-estimate.txt").read_text()
START_OF_PENDING = (FIXTURES / "squeue" / "start-of-pending.txt").read_text()


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=dt.UTC)


def test_a_pending_jobs_start_time_is_its_estimate_and_agrees_with_squeue_start() -> None:
    queue = parse_queue(PENDING_ESTIMATE, RECORDED)
    behind, running = queue[12], queue[11]
    assert (behind.state, behind.reason) == ("PENDING", "Resources")
    assert behind.started_at is None
    assert behind.expected_start == utc(2026, 12, 2, 4, 31, 13)
    (start_row,) = parse_delimited(START_OF_PENDING)
    assert behind.expected_start == parse_time(start_row["START_TIME"])
    # The running job's START_TIME is its start, not an estimate; its END_TIME, the limit, is the estimate's source.
    assert (running.started_at, running.expected_start) == (utc(2026, 12, 2, 4, 29, 13), None)
    assert behind.expected_start == utc(2026, 12, 2, 4, 31, 13) == running.started_at + dt.timedelta(minutes=2)


def test_a_pending_job_without_an_estimate_has_none() -> None:
    text = PENDING_ESTIMATE.replace("2026-12-02T04:31:13|5f2a9c7e01bd|2026-12-02T04:32:13", "N/A|5f2a9c7e01bd|N/A", 1)
    assert parse_queue(text, RECORDED)[12].expected_start is None


def test_test_only_names_the_start_and_a_refusal_names_none() -> None:
    assert parse_will_run((FIXTURES / "sbatch" / "test-only.txt").read_text()) == utc(2026, 12, 2, 4, 32, 13)
    assert parse_will_run((FIXTURES / "sbatch" / "test-only-refused.txt").read_text()) is None
    # Another line first (a warning) does not hide it; text that only resembles it is not read.
    assert parse_will_run("sbatch: warning: x\nsbatch: Job 9 to start at 2026-12-02T04:32:13 using 1 processors on nodes vm in partition gpu\n")
    assert parse_will_run("name: sbatch: Job 9 to start at 2026-12-02T04:32:13 using 1 processors on nodes vm\n") is None


def pending_job(slurm_job_id: int, account: str = "acme") -> Job:
    submitted = utc(2026, 12, 2, 4, 29, 13)
    return Job(
        id="c0ffee00-0000-4000-8000-000000000012", account=account, slurm_job_id=slurm_job_id, state="PENDING",
        finished=False, reason="Resources", node=None, submitted_at=submitted, started_at=None, ended_at=None,
        exit_code=None, exit_signal=None, elapsed_s=None, last_seen_at=submitted, updated_at=submitted,
        created_at=submitted, submit_attempted_at=submitted, expected_start_at=None,
    )


def test_the_refresher_stores_the_estimate_from_its_one_squeue_and_clears_it_at_the_start() -> None:
    slurm = SlurmClient(Settings(service_user="gpupool", service_group="gpupool"), tenants=object())  # type: ignore[arg-type]
    refresh = JobStateRefresher(None, slurm, interval_s=1, submission_grace_s=60)  # type: ignore[arg-type]
    # The recording's jobs are root's: here they are the tenant's of account acme, without a tag.
    recorded = PENDING_ESTIMATE.replace(f"root{RECORDED}root", f"gp-acme{RECORDED}acme").replace("gpupool:behind", "")
    queue = parse_queue(recorded, RECORDED)
    job = pending_job(12)
    now = utc(2026, 12, 2, 4, 29, 20)
    changes = refresh.changes(job, SlurmAnswers(queue, {}, {}), now)
    assert changes == {"expected_start_at": utc(2026, 12, 2, 4, 31, 13)}
    job.expected_start_at = changes["expected_start_at"]
    assert refresh.changes(job, SlurmAnswers(queue, {}, {}), now) == {}
    started = recorded.replace(
        "PENDING|5f2a9c7e01bd|Resources|5f2a9c7e01bd|2026-12-02T04:29:13|5f2a9c7e01bd|2026-12-02T04:31:13",
        "RUNNING|5f2a9c7e01bd|None|5f2a9c7e01bd|2026-12-02T04:29:13|5f2a9c7e01bd|2026-12-02T04:31:13",
    ).replace(f"{RECORDED}{RECORDED}gp-acme", f"{RECORDED}vm{RECORDED}gp-acme", 1)
    running = refresh.changes(job, SlurmAnswers(parse_queue(started, RECORDED), {}, {}), now)
    assert running["state"] == "RUNNING"
    assert running["started_at"] == utc(2026, 12, 2, 4, 31, 13)
    assert running["expected_start_at"] is None


def test_an_estimate_that_only_the_clock_moved_is_not_rewritten() -> None:
    slurm = SlurmClient(Settings(service_user="gpupool", service_group="gpupool"), tenants=object())  # type: ignore[arg-type]
    refresh = JobStateRefresher(None, slurm, interval_s=1, submission_grace_s=60)  # type: ignore[arg-type]
    recorded = PENDING_ESTIMATE.replace(f"root{RECORDED}root", f"gp-acme{RECORDED}acme").replace("gpupool:behind", "")
    queue = parse_queue(recorded, RECORDED)  # job 12 expected at 04:31:13
    job = pending_job(12)
    job.last_seen_at = utc(2026, 12, 2, 4, 31, 13)
    # Stored 04:31:10, both due by 04:31:13: unchanged. Stored long before a refresh at 04:20, a real change.
    job.expected_start_at = utc(2026, 12, 2, 4, 31, 10)
    assert refresh.changes(job, SlurmAnswers(queue, {}, {}), utc(2026, 12, 2, 4, 31, 13)) == {}
    assert refresh.changes(job, SlurmAnswers(queue, {}, {}), utc(2026, 12, 2, 4, 20, 0)) == {
        "expected_start_at": utc(2026, 12, 2, 4, 31, 13)
    }
