"""A spot job's states between runs and its run count, from squeue's and sacct's rows (pure: no Slurm, no database)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from gpupool.jobstate import JobStateRefresher, SlurmAnswers
from gpupool.models import Job
from gpupool.slurm.client import AccountingEntry, QueueEntry

NOW = dt.datetime(2026, 12, 2, 5, 0, 0, tzinfo=dt.UTC)
FIRST = NOW - dt.timedelta(seconds=60)
SECOND = NOW - dt.timedelta(seconds=5)
USER = "gp-spota"


class _Owner:
    """The one method of SlurmClient that changes() calls."""

    settings = SimpleNamespace(tenant_user_prefix="gp-")

    def owns(self, entry: QueueEntry | AccountingEntry, account: str, user: str | None = None) -> bool:
        return entry.account == account and entry.user == (user or "gp-" + account)


def refresher() -> JobStateRefresher:
    return JobStateRefresher(None, _Owner(), interval_s=1, submission_grace_s=60)  # type: ignore[arg-type]


def job(**values: Any) -> Job:
    fields: dict[str, Any] = dict(
        id="0b0e4c8e-8a8f-4a2b-9a59-0f6b3c1d2e4f", account="spota", slurm_job_id=41, state="RUNNING", reason=None,
        submitted_at=FIRST, started_at=FIRST, ended_at=None, node="vm", finished=False, exit_code=None, exit_signal=None,
        elapsed_s=None, last_seen_at=NOW, updated_at=NOW, submit_attempted_at=FIRST, created_at=FIRST,
        preemptible=True, run_count=1,
    )
    fields.update(values)
    return Job(**fields)


def queued(state: str, started_at: dt.datetime | None, reason: str | None = None) -> dict[int, QueueEntry]:
    entry = QueueEntry(41, state, reason, FIRST, started_at, None, "vm" if started_at else None, "", USER, "spota")
    return {41: entry}


def recorded(state: str, started_at: dt.datetime) -> dict[int, AccountingEntry]:
    return {41: AccountingEntry(41, state, 0, 15, FIRST, started_at, NOW, 18, "vm", None, USER, "spota")}


def answers(queue: dict[int, QueueEntry], accounting: dict[int, AccountingEntry] | None = None) -> SlurmAnswers:
    return SlurmAnswers(queue, accounting or {}, {})


def test_a_requeued_spot_job_pending_again_is_preempted_not_ended() -> None:
    changes = refresher().changes(job(), answers(queued("PENDING", None, "BeginTime")), NOW)
    assert changes["state"] == "PREEMPTED"
    assert "finished" not in changes and "run_count" not in changes


def test_sacct_saying_preempted_does_not_end_a_spot_job() -> None:
    # squeue may list the job as PREEMPTED while Slurm requeues it; sacct's record of the run says so too.
    changes = refresher().changes(job(), answers(queued("PREEMPTED", None), recorded("PREEMPTED", FIRST)), NOW)
    assert changes.get("state") == "PREEMPTED" and not changes.get("finished")
    assert "ended_at" not in changes


def test_the_next_run_counts_and_runs() -> None:
    changes = refresher().changes(job(state="PREEMPTED", started_at=None), answers(queued("RUNNING", SECOND)), NOW)
    assert (changes["state"], changes["started_at"], changes["run_count"]) == ("RUNNING", SECOND, 2)


def test_a_run_seen_only_in_its_final_record_counts_once() -> None:
    fresh = job(state="PENDING", started_at=None, run_count=0)
    first = refresher().changes(fresh, answers({}, recorded("COMPLETED", SECOND)), NOW)
    assert (first["state"], first["run_count"], first["finished"]) == ("COMPLETED", 1, True)


def test_a_full_price_job_pending_after_a_run_is_pending_and_preempted_ends_it() -> None:
    full = job(preemptible=False)
    assert refresher().changes(full, answers(queued("PENDING", None, "BeginTime")), NOW)["state"] == "PENDING"
    ended = refresher().changes(full, answers({}, recorded("PREEMPTED", FIRST)), NOW)
    assert (ended["state"], ended["finished"]) == ("PREEMPTED", True)


def test_the_same_answer_twice_changes_nothing_the_second_time() -> None:
    first = job()
    for column, value in refresher().changes(first, answers(queued("PENDING", None, "BeginTime")), NOW).items():
        setattr(first, column, value)
    assert refresher().changes(first, answers(queued("PENDING", None, "BeginTime")), NOW) == {}


def test_a_requeued_job_completing_counts_no_run_at_each_refresh() -> None:
    """While a requeued job completes, squeue's START_TIME is the current second (seen on 22.05), new at every refresh."""
    running = job()
    for second in range(3):
        changes = refresher().changes(running, answers(queued("COMPLETING", NOW + dt.timedelta(seconds=second))), NOW)
        assert "run_count" not in changes and "started_at" not in changes, changes
        for column, value in changes.items():
            setattr(running, column, value)
    assert (running.started_at, running.run_count) == (FIRST, 1)
    pending = refresher().changes(running, answers(queued("PENDING", None, "BeginTime")), NOW)
    assert pending["state"] == "PREEMPTED" and "run_count" not in pending
