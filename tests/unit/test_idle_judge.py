"""The idle judgement (gpupool.gpu_usage.idle.judge / next_step / record_doubt): pure, on hand-made samples and records."""

from __future__ import annotations

import datetime as dt

import pytest

from gpupool.gpu_usage.idle import (
    CANCEL,
    NOTIFY,
    REARM,
    Policy,
    Reading,
    Verdict,
    judge,
    next_step,
    record_doubt,
    under_since,
)
from gpupool.models import Job
from gpupool.slurm.detail import GpusHeldOnNode, RunningJob

T0 = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
POLICY = Policy(window_min=10, threshold_pct=5, grace_min=15, cancel=True, source="default")
GPUS = [("vm", 0), ("vm", 1)]


def minutes(n: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=n)


def every_minute(values: list[float | None], start: float = 0) -> list[Reading]:
    return [Reading(minutes(start + i), value) for i, value in enumerate(values)]


def test_every_gpu_under_the_threshold_for_the_whole_window_is_idle() -> None:
    samples = {gpu: every_minute([0.0] * 11) for gpu in GPUS}
    assert judge(samples, GPUS, POLICY, minutes(10)) == Verdict(True, T0)


def test_one_gpu_at_90_percent_keeps_the_job_busy() -> None:
    samples = {("vm", 0): every_minute([0.0] * 11), ("vm", 1): every_minute([90.0] * 11)}
    assert judge(samples, GPUS, POLICY, minutes(10)) == Verdict(False, None)


def test_a_window_not_yet_covered_is_not_idle_yet() -> None:
    samples = {gpu: every_minute([0.0] * 10) for gpu in GPUS}  # minutes 0..9
    assert judge(samples, GPUS, POLICY, minutes(9)) == Verdict(False, T0)


def test_a_busy_moment_inside_the_window_restarts_it() -> None:
    values: list[float | None] = [0.0] * 11
    values[4] = 60.0
    samples = {("vm", 0): every_minute([0.0] * 11), ("vm", 1): every_minute(values)}
    assert judge(samples, GPUS, POLICY, minutes(10)) == Verdict(False, minutes(5))
    assert judge(samples, GPUS, POLICY, minutes(10)).idle is False


def test_the_threshold_itself_is_not_under_it() -> None:
    samples = {gpu: every_minute([5.0] * 11) for gpu in GPUS}
    assert judge(samples, GPUS, POLICY, minutes(10)).idle is False
    samples = {gpu: every_minute([4.9] * 11) for gpu in GPUS}
    assert judge(samples, GPUS, POLICY, minutes(10)).idle is True


@pytest.mark.parametrize(
    ("samples", "why"),
    [
        ({("vm", 0): every_minute([0.0] * 11)}, "a GPU of the job the exporter never reported"),
        ({("vm", 0): every_minute([0.0] * 11), ("vm", 1): every_minute([0.0] * 5 + [None] + [0.0] * 5)}, "no utilization in one sample"),
        (
            {("vm", 0): every_minute([0.0] * 11), ("vm", 1): every_minute([0.0] * 3) + every_minute([0.0] * 2, start=9)},
            "a gap of 6 minutes without samples",
        ),
    ],
)
def test_missing_evidence_is_not_idleness(samples: dict[tuple[str, int], list[Reading]], why: str) -> None:
    assert judge(samples, GPUS, POLICY, minutes(10)).idle is False, why


def test_stale_samples_judge_nothing() -> None:
    samples = {gpu: every_minute([0.0] * 11) for gpu in GPUS}
    assert judge(samples, GPUS, POLICY, minutes(16)) == Verdict(False, None)  # the last sample is 6 minutes old


def test_no_gpus_or_a_zero_window_is_never_idle() -> None:
    samples = {gpu: every_minute([0.0] * 11) for gpu in GPUS}
    assert judge(samples, [], POLICY, minutes(10)).idle is False
    off = Policy(window_min=0, threshold_pct=5, grace_min=0, cancel=True, source="account a")
    assert judge(samples, GPUS, off, minutes(10)).idle is False


def test_samples_after_now_are_ignored() -> None:
    readings = every_minute([0.0] * 11)
    assert under_since(readings, 5, minutes(3)) == T0


def test_steps_notify_then_cancel_after_the_grace_then_nothing() -> None:
    idle = Verdict(True, T0)
    assert next_step(idle, POLICY, None, None, minutes(10)) == NOTIFY
    assert next_step(idle, POLICY, minutes(10), None, minutes(24)) is None
    assert next_step(idle, POLICY, minutes(10), None, minutes(25)) == CANCEL
    assert next_step(idle, POLICY, minutes(10), minutes(25), minutes(26)) is None
    keep = Policy(window_min=10, threshold_pct=5, grace_min=15, cancel=False, source="template t")
    assert next_step(idle, keep, minutes(10), None, minutes(60)) is None


def test_a_job_busy_again_after_its_notice_is_rearmed() -> None:
    busy = Verdict(False, None)
    assert next_step(busy, POLICY, minutes(10), None, minutes(12)) == REARM
    assert next_step(busy, POLICY, None, None, minutes(12)) is None


def record(account: str = "acme", user: str = "gp-acme", *held: GpusHeldOnNode) -> RunningJob:
    return RunningJob(41, "41", account, user, held or (GpusHeldOnNode("vm", (0, 1)),))


@pytest.mark.parametrize(
    ("running", "doubt"),
    [
        (record(), None),
        (record("rival", "gp-rival"), "it is gp-rival's under account rival, not gp-acme's under acme"),
        (record("acme", "gp-rival"), "it is gp-rival's under account acme, not gp-acme's under acme"),
        (record("rival", "gp-acme"), "it is gp-acme's under account rival, not gp-acme's under acme"),
        (record("acme", "gp-acme", GpusHeldOnNode("vm", (2,))), "it names 1 GPU(s), the job holds 2"),
        (record("acme", "gp-acme", GpusHeldOnNode("vm", (0, 1, 2))), "it names 3 GPU(s), the job holds 2"),
        # The same GPU named twice is one GPU.
        (record("acme", "gp-acme", GpusHeldOnNode("vm", (3,)), GpusHeldOnNode("vm", (3,))), "it names 1 GPU(s), the job holds 2"),
        (record("acme", "gp-acme", GpusHeldOnNode("vm", (3,)), GpusHeldOnNode("vm2", (3,))), None),
    ],
)
def test_a_record_is_believed_only_from_the_jobs_account_and_tenant_with_its_gpus(running: RunningJob, doubt: str | None) -> None:
    job = Job(id="j1", account="acme", gpus=2, slurm_job_id=41)
    assert record_doubt(running, job, "gp-acme") == doubt
