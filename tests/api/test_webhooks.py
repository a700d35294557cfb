"""Webhooks end to end: real jobs on the cluster, the refresher's events, the sender, a receiver on 127.0.0.1."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from gpupool_client import InvalidSignature, verify_signature
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from api.event_schemas import validate_event
from gpupool.config import Settings
from gpupool.models import Job, WebhookAttempt, WebhookEndpoint, WebhookEvent
from gpupool.webhooks.outbox import JobEvents
from gpupool.webhooks.sender import WebhookSender
from tests.conftest import bearer, wait_for, wait_for_state
from tests.support.receiver import WebhookReceiver, serve_webhooks

HELLO = {"template": "hello", "gpus": 1, "params": {"seconds": 0}}


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with serve_webhooks() as state:
        yield state


@pytest.fixture
def settings(session_settings: Settings, templates_dir: Path) -> Settings:
    return session_settings.replace(
        templates_dir=str(templates_dir), webhook_allow_cidrs=("127.0.0.0/8",), webhook_backoff_s=0.05
    )


@pytest.fixture
def sender(session_factory: sessionmaker, settings: Settings) -> Iterator[WebhookSender]:
    webhook_sender = WebhookSender(session_factory, settings)
    yield webhook_sender
    webhook_sender.close()


def register(client: FlaskClient, auth: dict[str, str], url: str, **extra: object) -> dict[str, object]:
    reply = client.post("/webhooks", json={"url": url, **extra}, headers=auth)
    assert reply.status_code == 201, reply.get_json()
    return reply.get_json()


def deliver_until(sender: WebhookSender, done: object, what: str) -> None:
    wait_for(lambda: sender.run_once() >= 0 and done(), what=what, interval_s=0.1)  # type: ignore[operator]


def test_receiver_gets_one_signed_job_ended_per_job(
    client: FlaskClient, auth: dict[str, str], receiver: WebhookReceiver, sender: WebhookSender
) -> None:
    endpoint = register(client, auth, receiver.base + "/all", events=["job.ended"])
    assert str(endpoint["secret"]).startswith("whsec_")
    assert "secret" not in client.get("/webhooks", headers=auth).get_json()["webhooks"][0]
    submitted = client.post("/submit", json={**HELLO, "callback_url": receiver.base + "/one"}, headers=auth).get_json()
    second = client.post("/submit", json=HELLO, headers=auth).get_json()
    job_ids = {submitted["job_id"], second["job_id"]}
    for job_id in job_ids:
        wait_for_state(client, job_id, auth, {"COMPLETED"})

    deliver_until(sender, lambda: len(receiver.at("/all")) >= 2 and receiver.at("/one"), "the deliveries")
    sender.run_once()  # nothing is owed twice

    events = [verify_signature(r.body, r.headers["Gpupool-Signature"], str(endpoint["secret"])) for r in receiver.at("/all")]
    assert sorted(event["data"]["job"]["job_id"] for event in events) == sorted(job_ids)
    assert {event["type"] for event in events} == {"job.ended"}
    for event in events:  # as the OpenAPI document's webhooks section describes them, nothing more
        validate_event(event)
    assert all(event["data"]["job"]["state"] == "COMPLETED" and event["data"]["job"]["exit_code"] == 0 for event in events)
    # hello writes nothing to its output folder, which the run-as helper listed as the job's user.
    assert [event["data"]["job"]["output_files"] for event in events] == [0, 0]
    assert len({event["id"] for event in events}) == 2
    assert all(r.headers["Gpupool-Event-Id"] == json_id for r, json_id in zip(receiver.at("/all"), [e["id"] for e in events], strict=True))
    # The callback URL gets that job's events, signed with the secret its submit answered with.
    callback = [verify_signature(r.body, r.headers["Gpupool-Signature"], submitted["callback_secret"]) for r in receiver.at("/one")]
    assert {event["data"]["job"]["job_id"] for event in callback} == {submitted["job_id"]}
    assert [event["type"] for event in callback if event["type"] == "job.ended"] == ["job.ended"]

    tampered = receiver.at("/all")[0]
    with pytest.raises(InvalidSignature):
        verify_signature(tampered.body.replace(b"COMPLETED", b"FAILED"), tampered.headers["Gpupool-Signature"], str(endpoint["secret"]))

    deliveries = client.get(f"/webhooks/{endpoint['id']}/deliveries", headers=auth).get_json()["deliveries"]
    assert sorted(d["job_id"] for d in deliveries) == sorted(job_ids)
    assert all(d["state"] == "delivered" and [a["status_code"] for a in d["attempts"]] == [200] for d in deliveries)


def test_job_ended_says_how_many_files_the_job_left_in_its_output_folder(
    client: FlaskClient, auth: dict[str, str], receiver: WebhookReceiver, sender: WebhookSender
) -> None:
    endpoint = register(client, auth, receiver.base + "/outputs", events=["job.ended"])
    # Three files at the top; a folder (its file is not counted), a link and a FIFO are not files.
    command = (
        'cd "$GPUPOOL_OUTPUT_DIR" && echo a > a.txt && echo b > b.txt && head -c 5000 /dev/urandom > c.bin'
        " && mkdir runs && echo x > runs/x.txt && ln -s /etc/shadow shadow && mkfifo pipe"
    )
    job = client.post("/submit", json={"template": "command", "gpus": 1, "params": {"command": command}}, headers=auth).get_json()
    wait_for_state(client, job["job_id"], auth, {"COMPLETED"})
    deliver_until(sender, lambda: receiver.at("/outputs"), "the job.ended delivery")
    (event,) = [verify_signature(r.body, r.headers["Gpupool-Signature"], str(endpoint["secret"])) for r in receiver.at("/outputs")]
    validate_event(event)
    assert (event["data"]["job"]["job_id"], event["data"]["job"]["output_files"]) == (job["job_id"], 3)
    listed = client.get(f"/jobs/{job['job_id']}/outputs/", headers=auth).get_json()
    assert sum(entry["type"] == "file" for entry in listed["entries"]) == 3


def test_a_receiver_answering_500_twice_gets_the_event_a_third_time(
    client: FlaskClient, auth: dict[str, str], receiver: WebhookReceiver, sender: WebhookSender
) -> None:
    receiver.scripted["/flaky"] = [500, 500]
    endpoint = register(client, auth, receiver.base + "/flaky", events=["job.ended"])
    job = client.post("/submit", json=HELLO, headers=auth).get_json()
    wait_for_state(client, job["job_id"], auth, {"COMPLETED"})

    deliver_until(sender, lambda: len(receiver.at("/flaky")) >= 3, "the third attempt")

    attempts = receiver.at("/flaky")
    assert len({r.headers["Gpupool-Event-Id"] for r in attempts}) == 1
    assert attempts[0].body == attempts[2].body
    (delivery,) = client.get(f"/webhooks/{endpoint['id']}/deliveries", headers=auth).get_json()["deliveries"]
    assert delivery["state"] == "delivered"
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 500, 200]


def test_redirects_are_not_followed(
    client: FlaskClient, auth: dict[str, str], receiver: WebhookReceiver, sender: WebhookSender, session_factory: sessionmaker
) -> None:
    receiver.redirects["/moved"] = receiver.base + "/elsewhere"
    register(client, auth, receiver.base + "/moved", events=["job.ended"])
    job = client.post("/submit", json=HELLO, headers=auth).get_json()
    wait_for_state(client, job["job_id"], auth, {"COMPLETED"})

    deliver_until(sender, lambda: len(receiver.at("/moved")) >= 2, "a retried redirect")

    assert receiver.at("/elsewhere") == []
    with session_factory() as session:
        errors = set(session.scalars(select(WebhookAttempt.error)))
    assert errors == {"redirects are not followed"}


@pytest.mark.parametrize("url", ["http://10.0.0.1/hook", "http://169.254.169.254/latest/meta-data/"])
def test_internal_addresses_are_refused_at_registration(
    client: FlaskClient, auth: dict[str, str], url: str, session_factory: sessionmaker, account: str
) -> None:
    for attempt in ({"url": url}, {**HELLO, "callback_url": url}):
        path = "/webhooks" if "template" not in attempt else "/submit"
        reply = client.post(path, json=attempt, headers=auth)
        assert reply.status_code == 422, reply.get_json()
        assert reply.get_json()["error"] == "webhook_url_refused"
    with session_factory() as session:
        # Nothing stored, so nothing can ever be sent there.
        # (The operator's own endpoint, a row of the migrations with no account, is not the customer's.)
        assert session.scalar(select(func.count()).select_from(WebhookEndpoint).where(WebhookEndpoint.account == account)) == 0
    assert client.get("/jobs", headers=auth).get_json()["jobs"] == []


def test_endpoints_belong_to_their_account(
    client: FlaskClient, auth: dict[str, str], receiver: WebhookReceiver, other_account: str, settings: Settings
) -> None:
    endpoint = register(client, auth, receiver.base + "/mine")
    other = bearer(settings, other_account, sub="mallory")
    assert client.get(f"/webhooks/{endpoint['id']}/deliveries", headers=other).status_code == 404
    assert client.delete(f"/webhooks/{endpoint['id']}", headers=other).status_code == 404
    assert client.get("/webhooks", headers=other).get_json()["webhooks"] == []
    assert client.delete(f"/webhooks/{endpoint['id']}", headers=auth).status_code == 204
    assert client.get("/webhooks", headers=auth).get_json()["webhooks"] == []


@pytest.mark.parametrize(("preemptible", "expected"), [(True, ["job.preempted", "job.started"]), (False, ["job.started"])])
def test_a_requeue_and_restart_between_two_refreshes_still_tells_each_run(
    session_factory: sessionmaker, account: str, preemptible: bool, expected: list[str]
) -> None:
    """Slurm requeued the job and started it again before the next refresh: PREEMPTED was never seen."""
    first_run = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)
    with session_factory() as session:
        job = Job(
            id=str(uuid.uuid4()), account=account, owner="alice", name="spot", template="hello", params={}, gpus=1, cpus=1,
            mem_gb=1, time_limit_min=60, job_dir="/nonexistent", state="RUNNING", finished=False, request_hash="0" * 64,
            slurm_job_id=999_001, preemptible=preemptible, started_at=first_run, run_count=1,
        )
        session.add(job)
        session.add(WebhookEndpoint(id=str(uuid.uuid4()), account=account, url="https://hooks.example.com/x",
                                    events="job.started,job.preempted,job.ended", secret="whsec_test", created_at=first_run))
        session.flush()
        events = JobEvents()
        events.note(job)
        job.started_at, job.run_count = first_run + dt.timedelta(minutes=3), 2  # what the refresher applies
        assert events.enqueue(session, first_run + dt.timedelta(minutes=3)) == len(expected)
        sent = session.scalars(select(WebhookEvent.type).where(WebhookEvent.job_id == job.id)).all()
        assert sorted(sent) == sorted(expected)
        # The same answer again: nothing new.
        again = JobEvents()
        again.note(job)
        assert again.enqueue(session, first_run + dt.timedelta(minutes=4)) == 0
