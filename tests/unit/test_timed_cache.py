"""The per-process cache in front of sinfo and scontrol ping."""

from __future__ import annotations

import time

import pytest

from api.caches import TimedCache
from gpupool.errors import SlurmUnavailable


class Flaky:
    def __init__(self) -> None:
        self.calls = 0
        self.failing = False

    def __call__(self) -> int:
        self.calls += 1
        if self.failing:
            raise SlurmUnavailable("down")
        return self.calls


def test_value_is_reused_within_its_ttl() -> None:
    fetch = Flaky()
    cache = TimedCache(fetch, ttl_s=60)
    assert [cache.get(), cache.get(), cache.get()] == [1, 1, 1]
    assert fetch.calls == 1


def test_value_is_fetched_again_after_its_ttl() -> None:
    fetch = Flaky()
    cache = TimedCache(fetch, ttl_s=0.01)
    assert cache.get() == 1
    time.sleep(0.02)
    assert cache.get() == 2


def test_an_error_is_not_remembered_by_default() -> None:
    fetch = Flaky()
    fetch.failing = True
    cache = TimedCache(fetch, ttl_s=60)
    with pytest.raises(SlurmUnavailable):
        cache.get()
    fetch.failing = False
    assert cache.get() == 2  # Slurm is back: the next call asks again


def test_an_error_is_remembered_for_its_own_ttl() -> None:
    fetch = Flaky()
    fetch.failing = True
    cache = TimedCache(fetch, ttl_s=60, error_ttl_s=60)
    for _ in range(3):
        with pytest.raises(SlurmUnavailable):
            cache.get()
    assert fetch.calls == 1


def test_keep_stale_serves_the_last_good_value_while_fetch_fails() -> None:
    fetch = Flaky()
    cache = TimedCache(fetch, ttl_s=0, keep_stale=True)
    assert cache.get() == 1
    fetch.failing = True
    assert cache.get() == 1
    assert fetch.calls == 2


def test_keep_stale_without_any_good_value_raises() -> None:
    fetch = Flaky()
    fetch.failing = True
    with pytest.raises(SlurmUnavailable):
        TimedCache(fetch, ttl_s=60, keep_stale=True).get()
