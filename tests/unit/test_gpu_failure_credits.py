"""Which runs a GPU failure credits, and the AdminComment column billing reads it from: pure, on literal text."""

from __future__ import annotations

import datetime as dt

import pytest

from billing.credits import FAILED_NODE, GPU_FAILURE, automatic_credits, credits_per_period, hit_by
from billing.sacct import read_gpu_failures
from gpupool.gpu_health.failure import GpuFailure
from gpupool.slurm.parse import ParseError
from tests.unit.test_billing_meter import run, utc

FAILURE = GpuFailure(reason="Xid 79 on 0000:41:00.0", node="gpu1", gpu="0000:41:00.0", at=utc("2026-11-10T10:09:58"), xid=79)


@pytest.mark.parametrize(("state", "start", "credited"), [
    ("CANCELLED", "2026-11-10T10:00:00", True),   # the check cancelled it: ended 10:10:00, the failure at 10:09:58
    ("REQUEUED", "2026-11-10T10:00:00", True),    # a spot job's run the check requeued
    ("COMPLETED", "2026-11-10T10:00:00", False),  # finished on its own: the failure was not its end
    ("CANCELLED", "2026-11-10T10:12:00", False),  # a later run of the requeued job, with the same comment
    ("RUNNING", "2026-11-10T10:00:00", False),    # not over yet
])
def test_only_the_run_the_failure_ended_is_credited(state: str, start: str, credited: bool) -> None:
    hit = run(600, start=start, state=state)
    if state == "RUNNING":
        hit.end = None

    credits = automatic_credits([hit], {7: FAILURE}, failed_nodes=True, gpu_failures=True)

    assert [(credit.cause, credit.failure) for credit in credits] == ([(GPU_FAILURE, FAILURE)] if credited else [])


def test_a_failure_minutes_after_the_run_ended_is_not_its_own() -> None:
    assert hit_by(run(600), FAILURE)
    assert not hit_by(run(60), FAILURE)  # ended 10:01:00, eight minutes before


def test_a_failed_node_run_is_credited_once_as_a_failed_node_and_the_switches_hold() -> None:
    node_fail = run(600, state="NODE_FAIL")

    assert [c.cause for c in automatic_credits([node_fail], {7: FAILURE}, failed_nodes=True, gpu_failures=True)] == [FAILED_NODE]
    assert [c.cause for c in automatic_credits([node_fail], {7: FAILURE}, failed_nodes=False, gpu_failures=True)] == [GPU_FAILURE]
    assert automatic_credits([run(600, state="CANCELLED")], {7: FAILURE}, failed_nodes=True, gpu_failures=False) == []


def test_the_credit_is_minus_each_periods_charges_of_that_run_alone() -> None:
    hit = run(600, state="CANCELLED", gpus={"rtx4090": 1, "rtx3090": 1})
    other_run = ("c", 7, utc("2026-11-10T11:00:00"), "rtx4090")
    amounts = {
        (("c", 7, hit.start, "rtx4090"), "2026-11"): 700, (("c", 7, hit.start, "rtx3090"), "2026-11"): 300,
        (other_run, "2026-11"): 5000,
    }

    assert credits_per_period(hit, amounts) == [("2026-11", -1000)]


def test_admin_comments_are_read_by_the_header_row() -> None:
    d = "\x1f"
    text = d.join(["JobIDRaw", "Start", "AdminComment"]) + "\n" + "\n".join([
        d.join(["41", "2026-11-10T10:00:00", FAILURE.comment()]),
        d.join(["41", "2026-11-10T10:12:00", FAILURE.comment()]),  # the requeued job's next run
        d.join(["42", "2026-11-10T10:00:00", "replaced the fan"]),
        d.join(["43", "2026-11-10T10:00:00", "two lines from an operator"]),
        "the second line",
        d.join(["44", "2026-11-10T10:00:00", ""]),
    ]) + "\n"

    assert read_gpu_failures(text, d) == {41: FAILURE}
    with pytest.raises(ParseError, match="AdminComment last"):
        read_gpu_failures(d.join(["AdminComment", "JobIDRaw"]) + "\n", d)


def test_the_comment_is_one_line_whatever_the_reason_held() -> None:
    odd = GpuFailure(reason="a; b\nc", node="n1", gpu="/dev/nvidia0", at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))

    assert "\n" not in odd.comment()
    assert read_gpu_failures(f"JobIDRaw|AdminComment\n5|{odd.comment()}\n", "|")[5].reason == "a, b c"
