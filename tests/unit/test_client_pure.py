"""gpupool_client's pure pieces: error typing, signatures, -p parsing, exit codes, line assembly."""

from __future__ import annotations

import json

import pytest
from gpupool_client import (
    InvalidSignature,
    PaymentRequired,
    RateLimited,
    ServiceUnavailable,
    ValidationFailed,
    compute_signature,
    verify_signature,
)
from gpupool_client._core import LineAssembler, RetryPolicy, outputs_path, safe_name, session_is_open, submit_body
from gpupool_client.cli import job_exit_code, parse_param
from gpupool_client.client import Job
from gpupool_client.errors import GpupoolError, error_from_response

SECRET = "whsec_test"


def test_api_error_bodies_become_typed_errors() -> None:
    paid = error_from_response(402, {}, {"error": "payment_required", "message": "m", "remaining": "1.5", "required": "9", "currency": "USD"})
    assert isinstance(paid, PaymentRequired) and (paid.remaining, paid.required, paid.currency) == ("1.5", "9", "USD")
    limited = error_from_response(429, {"Retry-After": "7"}, {"error": "rate_limited", "message": "m"})
    assert isinstance(limited, RateLimited) and limited.retry_after == 7
    down = error_from_response(503, {"Retry-After": "5"}, {"error": "slurm_unavailable", "message": "m", "job_id": "j"})
    assert isinstance(down, ServiceUnavailable) and (down.code, down.job_id, down.retry_after) == ("slurm_unavailable", "j", 5)
    unknown = error_from_response(400, {}, {"error": "unknown_fields", "message": "m", "unknown": ["gpu"], "valid": []})
    assert isinstance(unknown, ValidationFailed) and unknown.errors == [{"field": "gpu", "message": "unknown field"}]


def test_retry_waits_out_retry_after_and_gives_up_past_the_cap() -> None:
    policy = RetryPolicy(attempts=3, max_retry_after_s=60)
    assert policy.delay(0, RateLimited("m", retry_after=7)) == 7
    assert policy.delay(0, RateLimited("m", retry_after=600)) is None
    assert policy.delay(2, None) is None


def test_signature_round_trip_and_tampering() -> None:
    body = json.dumps({"id": "evt_1", "type": "job.ended"}).encode()
    header = f"t=1000,v1={compute_signature(body, 1000, SECRET)}"
    assert verify_signature(body, header, SECRET, now=1100)["id"] == "evt_1"
    with pytest.raises(InvalidSignature):
        verify_signature(body.replace(b"ended", b"ENDED"), header, SECRET, now=1100)
    with pytest.raises(InvalidSignature):
        verify_signature(body, header, "another secret", now=1100)
    with pytest.raises(InvalidSignature):
        verify_signature(body, header, SECRET, now=1000 + 301)  # replayed too late
    rotated = f"t=1000,v1={'0' * 64},v1={compute_signature(body, 1000, SECRET)}"
    assert verify_signature(body, rotated, SECRET, now=1000)["type"] == "job.ended"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("seconds=5", ("seconds", 5)), ("message=hi there", ("message", "hi there")), ('message="5"', ("message", "5")),
     ("flag=true", ("flag", True)), ("eq=a=b", ("eq", "a=b")), ("sizes=[1,2]", ("sizes", [1, 2]))],
)
def test_param_values_are_json_when_they_parse(text: str, expected: tuple[str, object]) -> None:
    assert parse_param(text) == expected


@pytest.mark.parametrize(
    ("state", "exit_code", "exit_signal", "expected"),
    [("COMPLETED", 0, None, 0), ("FAILED", 3, None, 3), ("FAILED", 0, 9, 137), ("FAILED", None, None, 1),
     ("CANCELLED", 0, 15, 130), ("TIMEOUT", 0, None, 124), ("NODE_FAIL", 0, None, 125),
     ("OUT_OF_MEMORY", 0, None, 137), ("PREEMPTED", 0, None, 123), ("UNKNOWN", None, None, 122)],
)
def test_wait_exit_codes(state: str, exit_code: int | None, exit_signal: int | None, expected: int) -> None:
    job = Job(None, {"job_id": "j", "state": state, "exit_code": exit_code, "exit_signal": exit_signal})  # type: ignore[arg-type]
    assert job_exit_code(job) == expected


def test_lines_split_across_chunks_and_characters_arrive_whole() -> None:
    assembler = LineAssembler()
    euro = "€".encode()
    out = [*assembler.feed(b"one\ntw"), *assembler.feed(b"o " + euro[:1]), *assembler.feed(euro[1:] + b"\nthree")]
    assert out == ["one\n", "two €\n"]
    assert list(assembler.finish()) == ["three"]


def test_a_job_slurm_never_reported_is_done_without_an_end_time() -> None:
    unknown = Job(None, {"job_id": "j", "state": "UNKNOWN", "ended_at": None})  # type: ignore[arg-type]
    running = Job(None, {"job_id": "j", "state": "RUNNING", "ended_at": None})  # type: ignore[arg-type]
    assert unknown.done and not running.done


@pytest.mark.parametrize(("state", "opened"), [("starting", False), ("ready", True), ("idle", True)])
def test_a_session_opens_once_ready_or_idle(state: str, opened: bool) -> None:
    assert session_is_open({"job_id": "j", "state": state, "end_reason": None}) is opened


def test_a_session_that_ended_first_says_why() -> None:
    # The session sweep's words (gpupool.sessions.idle_reason), as the API hands them on.
    reason = "idle: no request, no open WebSocket and no GPU at 5% or more for 1 min; gpupool cancelled it"
    with pytest.raises(GpupoolError) as info:
        session_is_open({"job_id": "j1", "state": "ended", "end_reason": reason})
    assert info.value.code == "session_ended"
    assert info.value.message == f"session j1 ended before it was ready: {reason}"


def test_submit_body_carries_array_and_sweep() -> None:
    common: dict[str, object] = dict(gpus=1, params=None, gpu_type=None, name=None, container_image=None, cpus=None, mem_gb=None, time_limit_min=None)
    assert submit_body("hello", **common, array=20)["array"] == {"count": 20}  # type: ignore[arg-type]
    body = submit_body("hello", **common, array={"max_parallel": 2}, sweep={"message": ("a", "b")})  # type: ignore[arg-type]
    assert (body["array"], body["sweep"]) == ({"max_parallel": 2}, {"message": ["a", "b"]})
    assert "array" not in submit_body("hello", **common) and "sweep" not in submit_body("hello", **common)  # type: ignore[arg-type]


def test_an_output_path_quotes_each_name_and_keeps_its_slashes() -> None:
    assert outputs_path("j-1") == "/jobs/j-1/outputs/"
    assert outputs_path("j/1", "run 1/a#b?.bin") == "/jobs/j%2F1/outputs/run%201/a%23b%3F.bin"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\\b", "a\x00b"])
def test_a_listed_name_that_could_leave_its_folder_is_refused(name: str) -> None:
    with pytest.raises(GpupoolError) as refused:
        safe_name(name)
    assert refused.value.code == "name_refused"


def test_a_plain_listed_name_is_kept() -> None:
    assert safe_name("résumé .txt") == "résumé .txt"

