"""GET /jobs/<id>/logs on real jobs: following by offset, and logs a job has tampered with."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker
from werkzeug.test import TestResponse

from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from tests.conftest import bearer, create_app_for_tests, wait_for, wait_for_state

TICKER_LINES = 300
# Multi-byte characters, so capped reads fall inside them now and then.
TICKER_BODY = """for i in $(seq 1 "$GPUPOOL_PARAM_LINES"); do
  printf 'line %04d: h\u00e9llo \u2713 \U0001f680\\n' "$i"
  sleep 0.02
done
"""
TICKER_SPEC = """description = "Print numbered lines, a few a second."
[params.lines]
type = "integer"
minimum = 1
maximum = 100000
"""
# What a hostile job does to its own folder, which it owns: point its logs elsewhere.
PLANTER_BODY = """echo "written before the swap"
ln -sfn /etc/shadow "$GPUPOOL_JOB_DIR/stdout.log"
rm -f "$GPUPOOL_JOB_DIR/stderr.log"
mkfifo "$GPUPOOL_JOB_DIR/stderr.log"
"""


def ticker_output(lines: int) -> bytes:
    return "".join(f"line {i:04d}: h\u00e9llo \u2713 \U0001f680\n" for i in range(1, lines + 1)).encode()


@pytest.fixture(scope="module")
def templates_dir(templates_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's templates, plus the two this module's jobs run."""
    root = tmp_path_factory.mktemp("log-templates")
    shutil.copytree(templates_dir, root, dirs_exist_ok=True)
    for name, spec, body in (("ticker", TICKER_SPEC, TICKER_BODY), ("planter", 'description = "Swap its logs."\n', PLANTER_BODY)):
        (root / name).mkdir()
        (root / name / "template.toml").write_text(spec)
        (root / name / "run.sh").write_text(body)
    return root


def submit(client: FlaskClient, headers: dict[str, str], **body: object) -> dict:
    response = client.post("/submit", headers=headers, json=body)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def logs(client: FlaskClient, job_id: str, auth: dict[str, str], query: str = "") -> TestResponse:
    return client.get(f"/jobs/{job_id}/logs{'?' + query if query else ''}", headers=auth)


def follow(client: FlaskClient, job_id: str, auth: dict[str, str], limit: int) -> list[TestResponse]:
    """Read the log from offset 0 as a follower does, until the server says it is complete."""
    answers: list[TestResponse] = []
    offset = 0
    deadline = time.monotonic() + 300  # queueing behind other jobs included; a guard, not a measure
    while time.monotonic() < deadline:
        answer = logs(client, job_id, auth, f"offset={offset}&limit={limit}")
        assert answer.status_code == 200, answer.get_json()
        assert answer.content_type == "text/plain; charset=utf-8"
        body = answer.get_data()
        assert len(body) <= limit
        assert int(answer.headers["Gpupool-Next-Offset"]) == offset + len(body)
        answers.append(answer)
        if answer.headers["Gpupool-Log-Complete"] == "true":
            return answers
        offset += len(body)
        if not body:
            time.sleep(0.2)
    raise AssertionError(f"the log of {job_id} never completed; {len(answers)} reads")


def job_folder(settings: Settings, account: str, job_id: str) -> Path:
    folder = Path(settings.job_root) / account / job_id
    assert folder.is_dir()
    return folder


def test_follower_reassembles_exact_stdout_while_the_job_runs(
    client: FlaskClient, auth: dict[str, str], account: str, settings: Settings
) -> None:
    created = submit(client, auth, template="ticker", gpus=1, params={"lines": TICKER_LINES})
    answers = follow(client, created["job_id"], auth, limit=333)

    expected = ticker_output(TICKER_LINES)
    assert b"".join(answer.get_data() for answer in answers) == expected
    assert (job_folder(settings, account, created["job_id"]) / "stdout.log").read_bytes() == expected
    last = answers[-1]
    assert (last.headers["Gpupool-Job-State"], last.headers["Gpupool-Next-Offset"]) == ("COMPLETED", str(len(expected)))
    # Read piece by piece as it was written, not in one go at the end.
    assert any(a.get_data() and a.headers["Gpupool-Log-Complete"] == "false" for a in answers)
    assert {a.headers["Gpupool-Job-State"] for a in answers} & {"PENDING", "RUNNING"}

    at_end = logs(client, created["job_id"], auth, f"offset={len(expected)}")
    assert (at_end.get_data(), at_end.headers["Gpupool-Next-Offset"], at_end.headers["Gpupool-Log-Complete"]) == (
        b"", str(len(expected)), "true"
    )
    past_end = logs(client, created["job_id"], auth, f"offset={len(expected) + 10}")
    assert past_end.status_code == 200
    assert (past_end.get_data(), past_end.headers["Gpupool-Next-Offset"]) == (b"", str(len(expected) + 10))
    tail = logs(client, created["job_id"], auth, "tail=2")
    assert tail.get_data() == b"".join(expected.splitlines(keepends=True)[-2:])
    assert tail.headers["Gpupool-Job-State"] == "COMPLETED"
    assert "Gpupool-Next-Offset" not in tail.headers


def test_log_of_a_job_not_yet_writing_is_empty_from_any_offset(
    client: FlaskClient, auth: dict[str, str], settings: Settings, other_account: str
) -> None:
    other = bearer(settings, other_account, sub="bob")
    holder = submit(client, other, template="hello", gpus=4, params={"seconds": 300})
    wait_for_state(client, holder["job_id"], other, {"RUNNING"})
    waiting = submit(client, auth, template="hello", gpus=1)
    wait_for(lambda: client.get(f"/jobs/{waiting['job_id']}", headers=auth).get_json()["state"] == "PENDING", what="PENDING")
    for offset in (0, 42):
        answer = logs(client, waiting["job_id"], auth, f"offset={offset}")
        assert (answer.status_code, answer.get_data()) == (200, b"")
        assert answer.headers["Gpupool-Next-Offset"] == str(offset)
        assert answer.headers["Gpupool-Log-Complete"] == "false"
        assert answer.headers["Gpupool-Job-State"] == "PENDING"
    assert client.delete(f"/jobs/{holder['job_id']}", headers=other).status_code == 202


def test_logs_a_job_pointed_elsewhere_are_refused_never_followed(
    client: FlaskClient, auth: dict[str, str], account: str, settings: Settings
) -> None:
    created = submit(client, auth, template="planter", gpus=1)
    done = wait_for_state(client, created["job_id"], auth, {"COMPLETED", "FAILED"})
    assert done["state"] == "COMPLETED"
    folder = job_folder(settings, account, created["job_id"])
    assert os.readlink(folder / "stdout.log") == "/etc/shadow"  # the job really did swap it
    shadow = Path("/etc/shadow").read_text()

    for query in ("", "tail=1", "offset=0", "offset=0&limit=10"):
        answer = logs(client, created["job_id"], auth, query)
        assert answer.status_code == 409, query
        assert answer.get_json() == {
            "error": "log_unavailable",
            "message": "the job's log stdout.log is not served: it is a symbolic link",
        }
        assert shadow.split(":", 1)[0] + ":" not in answer.get_data(as_text=True)
    fifo = logs(client, created["job_id"], auth, "stream=stderr")  # answers at once: no writer needed
    assert fifo.status_code == 409
    assert fifo.get_json() == {
        "error": "log_unavailable",
        "message": "the job's log stderr.log is not a regular file; it cannot be served",
    }


def test_log_owned_by_someone_else_is_refused(
    client: FlaskClient, auth: dict[str, str], account: str, settings: Settings
) -> None:
    created = submit(client, auth, template="hello", gpus=1, params={"message": "mine"})
    wait_for_state(client, created["job_id"], auth, {"COMPLETED"})
    stdout = job_folder(settings, account, created["job_id"]) / "stdout.log"
    assert logs(client, created["job_id"], auth, "offset=0").get_data().endswith(b"mine\n")
    # As root, as a hard link to a foreign file would look: a regular file the tenant does not own.
    stdout.unlink()
    stdout.write_text("root's secret\n")
    os.chown(stdout, 0, 0)
    answer = logs(client, created["job_id"], auth)
    assert answer.status_code == 409
    assert answer.get_json() == {
        "error": "log_unavailable",
        "message": "the job's log stdout.log is not owned by the account's user; it cannot be served",
    }


BAD_LOG_QUERIES = [
    ("offset=0&tail=5", "offset and tail cannot be combined: follow with offset, or look back with tail"),
    ("tail=5&offset=0", "offset and tail cannot be combined: follow with offset, or look back with tail"),
    ("limit=10", "limit applies to offset reads only"),
    ("offset=-1", "offset must be between 0 and 9007199254740991"),
    ("offset=9007199254740992", "offset must be between 0 and 9007199254740991"),
    ("offset=x", "offset must be an integer"),
    ("offset=0&limit=0", "limit must be between 1 and 9007199254740991"),
    ("offset=0&limit=9007199254740992", "limit must be between 1 and 9007199254740991"),
]


def test_bad_log_queries(client: FlaskClient, auth: dict[str, str]) -> None:
    created = submit(client, auth, template="hello", gpus=1)
    for query, message in BAD_LOG_QUERIES:
        answer = logs(client, created["job_id"], auth, query)
        assert (answer.status_code, answer.get_json()) == (400, {"error": "bad_request", "message": message}), query


def test_reads_are_capped_by_log_read_max_bytes(
    client: FlaskClient,
    auth: dict[str, str],
    settings: Settings,
    slurm: SlurmClient,
    session_factory: sessionmaker,
) -> None:
    created = submit(client, auth, template="ticker", gpus=1, params={"lines": 50})
    wait_for_state(client, created["job_id"], auth, {"COMPLETED"})
    expected = ticker_output(50)
    capped = create_app_for_tests(settings.replace(log_read_max_bytes=100), slurm, session_factory).test_client()
    assert logs(capped, created["job_id"], auth, "tail=1000").get_data() == expected[-100:]
    first = logs(capped, created["job_id"], auth, "offset=0")
    assert (first.get_data(), first.headers["Gpupool-Next-Offset"]) == (expected[:100], "100")
    assert first.headers["Gpupool-Log-Complete"] == "false"
    # A larger limit reads the most one answer carries, as the document says.
    too_much = logs(capped, created["job_id"], auth, "offset=0&limit=101")
    assert (too_much.status_code, too_much.get_data(), too_much.headers["Gpupool-Next-Offset"]) == (200, expected[:100], "100")
