"""Bad input gets a clear 4xx JSON error before anything reaches Slurm: the request's shape and values.

What needs Slurm's or the database's own answer (tokens of unknown accounts, another
account's jobs, idempotent replays) stays in tests/api/test_errors.py.
"""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from tests.support.http import assert_error

HELLO = {"template": "hello", "gpus": 1, "params": {"message": "hi", "seconds": 0}}


def test_health_and_openapi_need_no_token(client: FlaskClient) -> None:
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json()["checks"] == {"database": "ok", "slurm": "ok"}  # scontrol ping, as recorded
    assert client.get("/openapi.json").status_code == 200


def test_unknown_fields_are_listed(client: FlaskClient, auth: dict[str, str]) -> None:
    body = assert_error(client.post("/submit", headers=auth, json={**HELLO, "partition": "debug", "qos": "x"}), 400, "unknown_fields")
    assert body["unknown"] == ["partition", "qos"]
    assert "template" in body["valid"] and "gpus" in body["valid"]
    assert "partition" in body["message"] and "container_image" in body["message"]


@pytest.mark.parametrize(
    ("data", "content_type", "status", "code"),
    [
        ("{not json", "application/json", 400, "bad_request"),
        ("[1, 2]", "application/json", 400, "bad_request"),
        ('{"template": "hello"}', "text/plain", 415, "unsupported_media_type"),
        ("template=hello", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
    ],
)
def test_malformed_bodies(client: FlaskClient, auth: dict[str, str], data: str, content_type: str, status: int, code: str) -> None:
    assert_error(client.post("/submit", headers=auth, data=data, content_type=content_type), status, code)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"gpus": 5}, "at most 4"),
        ({"gpus": 0}, "gpus"),
        ({"gpus": "2"}, "gpus"),
        ({"gpus": 1.5}, "gpus"),
        ({"gpu_type": "a100"}, "a100"),
        ({"gpu_type": "RTX;4090"}, "gpu_type"),
        ({"template": "nope"}, "unknown template"),
        ({"template": "../etc"}, "template"),
        ({"params": {"message": "a\x00b"}}, "NUL"),
        ({"params": {"seconds": 3601}}, "3600"),
        ({"params": {"seconds": -1}}, "seconds"),
        ({"params": {"command": "rm -rf /"}}, "command"),
        ({"params": "message"}, "params"),
        ({"name": "a\n0"}, "control characters"),
        ({"time_limit_min": 10**6}, "time_limit_min"),
        ({"container_image": "ubuntu:22.04"}, "without containers"),
        ({"container_image": "nvcr.io#nvidia/pytorch:24.01-py3;rm"}, "container_image"),
        ({"requeue_on_failure": True, "array": {"count": 2}}, "cannot ask for requeue_on_failure"),
        ({"requeue_on_failure": True, "params": {"message": "hi"}, "sweep": {"seconds": [1, 2]}}, "cannot ask for requeue_on_failure"),
        ({"requeue_on_failure": [True]}, "requeue_on_failure"),
    ],
)
def test_invalid_values_get_422(client: FlaskClient, auth: dict[str, str], changes: dict, needle: str) -> None:
    # Refused before the run-as helper (NoTenants would answer 500): nothing reaches sbatch.
    body = assert_error(client.post("/submit", headers=auth, json={**HELLO, **changes}), 422)
    assert needle in body["message"]


def test_inference_template_is_limited_to_one_gpu(client: FlaskClient, auth: dict[str, str]) -> None:
    body = {"template": "inference", "gpus": 2, "params": {"model": "m", "input": "x"}}
    assert "at most 1" in assert_error(client.post("/submit", headers=auth, json=body), 422)["message"]


def test_wrong_methods_and_paths(client: FlaskClient, auth: dict[str, str]) -> None:
    response = client.put("/jobs/x", headers=auth, json={})
    assert_error(response, 405, "method_not_allowed")
    assert "DELETE" in response.headers["Allow"]
    assert_error(client.get("/submit", headers=auth), 405)
    assert_error(client.get("/nothing-here", headers=auth), 404)
    assert_error(client.get("/jobs/x/logs?stream=stdin", headers=auth), 404)
