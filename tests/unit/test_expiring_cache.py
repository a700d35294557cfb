"""The keyed per-process cache in front of the token check, on a hand-moved clock."""

from __future__ import annotations

import pytest

from api.caches import ExpiringCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Source:
    """Answers ``key:<n>`` where n counts the reads of that key."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def __call__(self, key: str) -> str:
        self.reads.append(key)
        return f"{key}:{self.reads.count(key)}"


def test_an_answer_is_reused_within_its_ttl_per_key() -> None:
    clock, source = Clock(), Source()
    cache: ExpiringCache[str, str] = ExpiringCache(5, clock=clock)
    assert [cache.get("a", source), cache.get("b", source), cache.get("a", source)] == ["a:1", "b:1", "a:1"]
    clock.now += 4.9
    assert cache.get("a", source) == "a:1"
    assert source.reads == ["a", "b"]


def test_an_answer_is_read_again_once_its_ttl_has_passed() -> None:
    clock, source = Clock(), Source()
    cache: ExpiringCache[str, str] = ExpiringCache(5, clock=clock)
    assert cache.get("a", source) == "a:1"
    clock.now += 5
    assert cache.get("a", source) == "a:2"
    clock.now += 4
    assert cache.get("a", source) == "a:2"


def test_none_is_cached_like_any_answer() -> None:
    clock, reads = Clock(), []

    def absent(key: str) -> None:
        reads.append(key)

    cache: ExpiringCache[str, None] = ExpiringCache(5, clock=clock)
    assert cache.get("ghost", absent) is None
    assert cache.get("ghost", absent) is None
    assert reads == ["ghost"]


def test_ttl_zero_reads_every_time_and_keeps_nothing() -> None:
    source = Source()
    cache: ExpiringCache[str, str] = ExpiringCache(0, clock=Clock())
    assert [cache.get("a", source) for _ in range(3)] == ["a:1", "a:2", "a:3"]
    assert len(cache) == 0


def test_age_counts_from_before_the_read() -> None:
    clock = Clock()

    def slow(key: str) -> str:
        clock.now += 3  # the read itself took 3 s
        return key

    cache: ExpiringCache[str, str] = ExpiringCache(5, clock=clock)
    cache.get("a", slow)
    clock.now += 2  # 5 s after the read began, 2 s after it ended
    source = Source()
    assert cache.get("a", source) == "a:1"


def test_a_full_cache_drops_expired_entries_first_then_the_oldest() -> None:
    clock, source = Clock(), Source()
    cache: ExpiringCache[str, str] = ExpiringCache(5, max_entries=3, clock=clock)
    cache.get("old", source)
    clock.now += 10
    cache.get("a", source)
    cache.get("b", source)
    cache.get("c", source)  # full: "old" has expired and goes
    assert len(cache) == 3
    assert cache.get("a", source) == "a:1"
    cache.get("d", source)  # full of fresh entries: the oldest, "a", goes
    assert len(cache) == 3
    assert cache.get("b", source) == "b:1"
    assert cache.get("a", source) == "a:2"


def test_a_failed_read_is_not_cached() -> None:
    source, calls = Source(), []

    def failing(key: str) -> str:
        calls.append(key)
        raise RuntimeError("database down")

    cache: ExpiringCache[str, str] = ExpiringCache(5, clock=Clock())
    with pytest.raises(RuntimeError):
        cache.get("a", failing)
    assert calls == ["a"]
    assert cache.get("a", source) == "a:1"


@pytest.mark.parametrize(("ttl_s", "max_entries"), [(-1, 10), (5, 0)])
def test_nonsense_limits_are_refused(ttl_s: float, max_entries: int) -> None:
    with pytest.raises(ValueError):
        ExpiringCache(ttl_s, max_entries=max_entries)
