"""job.ended's output_files: counted once per ended job an endpoint wants, by one listing, capped; null when it cannot be.

On the migrated SQLite schema, with the refresher's own ``JobEvents`` and the
storage agent's listing stood in for (``StorageClient.output_get``); the count
of a real job's files through the run-as helper is tests/api/test_webhooks.py's.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.event_schemas import validate_event
from gpupool.config import Settings
from gpupool.errors import NotFound, RunasUnavailable, TenantError
from gpupool.models import Job, WebhookEndpoint, WebhookEvent
from gpupool.storage.client import Answer, StorageClient
from gpupool.storage.paths import StoragePath
from gpupool.webhooks.outbox import OUTPUT_COUNTS_PER_PASS, OUTPUT_FILES_CAP, JobEvents, output_counter
from tests.app.conftest import ACCOUNT

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


def job_id(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


@pytest.fixture
def running(session_factory: sessionmaker) -> sessionmaker:
    """30 running jobs of the account, an endpoint that wants job.ended (and job.started), and one that wants neither."""
    with session_factory() as session, session.begin():
        for n in range(30):
            session.add(Job(
                id=job_id(n), account=ACCOUNT, owner="alice", name="j", template="command", params={}, gpus=1, cpus=1, mem_gb=1,
                time_limit_min=1, job_dir=f"/nonexistent/{n}", state="RUNNING", finished=False, slurm_job_id=100 + n,
                submitted_at=NOW, started_at=NOW, run_count=1, request_hash="0" * 64, created_at=NOW, updated_at=NOW,
            ))
        session.add(WebhookEndpoint(id="e" * 36, account=ACCOUNT, url="https://hooks.example/a", events="job.ended,job.started", secret="s"))
        session.add(WebhookEndpoint(id="f" * 36, account=ACCOUNT, url="https://hooks.example/b", events="job.preempted", secret="s"))
    return session_factory


def end(session: Session, events: JobEvents, jobs: list[Job]) -> None:
    for job in jobs:
        events.note(job)
        job.state, job.finished, job.ended_at, job.exit_code = "COMPLETED", True, NOW, 0
    events.enqueue(session, NOW)


def ended_payloads(session: Session) -> dict[str, dict[str, Any]]:
    return {event.job_id or "": event.payload for event in session.scalars(select(WebhookEvent).where(WebhookEvent.type == "job.ended"))}


def test_each_ended_job_gets_its_count_and_the_pass_stops_counting_at_its_cap(running: sessionmaker) -> None:
    counted: list[str] = []

    def count(job: Job) -> int | None:
        counted.append(job.id)
        return int(job.id[-2:])

    with running() as session, session.begin():
        jobs = list(session.scalars(select(Job).order_by(Job.id)))
        end(session, JobEvents(count), jobs)
    with running() as session:
        payloads = ended_payloads(session)
    assert len(payloads) == 30 and len(counted) == OUTPUT_COUNTS_PER_PASS
    for jid, payload in payloads.items():
        validate_event(payload)  # as the OpenAPI document's webhooks section describes it
        expected = int(jid[-2:]) if jid in counted else None  # past the pass's cap: null, never a wait
        assert payload["data"]["job"]["output_files"] == expected, jid


def test_a_helper_that_fails_is_asked_once_a_pass_and_its_jobs_say_null(running: sessionmaker) -> None:
    asked: list[str] = []

    def count(job: Job) -> int | None:
        asked.append(job.id)
        raise RunasUnavailable("the gpupool run-as helper is not answering")

    with running() as session, session.begin():
        end(session, JobEvents(count), list(session.scalars(select(Job).order_by(Job.id).limit(3))))
    with running() as session:
        payloads = ended_payloads(session)
    assert len(asked) == 1
    assert [payload["data"]["job"]["output_files"] for payload in payloads.values()] == [None, None, None]


def test_without_a_counter_or_an_endpoint_that_wants_it_nothing_is_counted(running: sessionmaker) -> None:
    asked: list[str] = []

    def count(job: Job) -> int | None:
        asked.append(job.id)
        return 1

    with running() as session, session.begin():
        first, second = session.scalars(select(Job).order_by(Job.id).limit(2))
        end(session, JobEvents(), [first])
        # Only the endpoint that wants job.preempted is left: no event, no listing.
        session.get(WebhookEndpoint, "e" * 36).deleted_at = NOW  # type: ignore[union-attr]
        end(session, JobEvents(count), [second])
    with running() as session:
        payloads = ended_payloads(session)
    assert [payload["data"]["job"]["output_files"] for payload in payloads.values()] == [None] and asked == []


def test_the_counter_lists_the_top_once_as_the_job_and_counts_its_files(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, str, StoragePath, int]] = []
    answers: list[Answer | Exception] = [
        Answer({"ok": True, "entries": [
            {"name": "a.bin", "type": "file", "size": 1, "mtime_ns": 0}, {"name": "b.txt", "type": "file", "size": 2, "mtime_ns": 0},
            {"name": "runs", "type": "folder", "size": None, "mtime_ns": 0}, {"name": "latest", "type": "link", "size": None, "mtime_ns": 0},
        ], "next_after": None, "skipped": 0}),
        NotFound("no such file or folder: /"),
        TenantError("the run-as helper refused"),
    ]

    def output_get(self: StorageClient, account: str, job: str, path: StoragePath, *, limit: int = 1000, after: str | None = None) -> Answer:
        asked.append((account, job, path, limit))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(StorageClient, "output_get", output_get)
    count = output_counter(settings)
    job = Job(id=job_id(1), account=ACCOUNT)
    assert count(job) == 2  # files only: a folder is not looked into, a link is not a file
    assert count(job) == 0  # no output folder: the job never ran its script
    with pytest.raises(TenantError):
        count(job)  # JobEvents makes it null
    assert asked == [(ACCOUNT, job_id(1), StoragePath((), True), OUTPUT_FILES_CAP)] * 3
