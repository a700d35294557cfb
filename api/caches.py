"""The API's per-process caches: answers trusted for a fixed number of seconds.

- ``ExpiringCache``: values by key (verified tokens, token standings, the
  sessions' proxy answers), each fetched on a miss.
- ``TimedCache``: one value of Slurm's (the cluster's GPU inventory, the
  controller's ping), with its own time for a failure and the choice of serving
  the last good value while Slurm does not answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from gpupool.errors import SlurmUnavailable

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")


class ExpiringCache(Generic[K, V]):
    """``fetch(key)``'s answer, reused for ``ttl_s`` seconds; at most ``max_entries`` keys kept.

    ``None`` is an answer like any other and is cached too. With ``ttl_s`` 0
    nothing is kept and every ``get`` fetches. An entry's age counts from just
    before its fetch began, so no answer is trusted longer than ``ttl_s`` after
    the read that produced it started.
    """

    def __init__(self, ttl_s: float, *, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s < 0 or max_entries < 1:
            raise ValueError("ttl_s must be 0 or more and max_entries at least 1")
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (fetched_at, value), oldest fetch first.
        self._entries: dict[K, tuple[float, V]] = {}

    def get(self, key: K, fetch: Callable[[K], V]) -> V:
        if self._ttl_s == 0:
            return fetch(key)
        started = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and started - entry[0] < self._ttl_s:
                return entry[1]
        # Fetched outside the lock: one slow database read must not hold up every other key.
        value = fetch(key)
        with self._lock:
            self._entries.pop(key, None)
            if len(self._entries) >= self._max_entries:
                self._evict(self._clock())
            self._entries[key] = (started, value)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def _evict(self, now: float) -> None:
        """Drop expired entries; if that frees nothing, the oldest. Called with the lock held."""
        fresh = {key: entry for key, entry in self._entries.items() if now - entry[0] < self._ttl_s}
        while len(fresh) >= self._max_entries:
            del fresh[next(iter(fresh))]
        self._entries = fresh


class TimedCache(Generic[T]):
    """``fetch``'s last value for ``ttl_s``, its last SlurmUnavailable for ``error_ttl_s``, per process.

    With ``keep_stale``, a failed refresh serves the last good value instead:
    better a minute-old cluster shape than refusing every submit while Slurm blinks.
    """

    def __init__(self, fetch: Callable[[], T], ttl_s: float, *, error_ttl_s: float = 0.0, keep_stale: bool = False) -> None:
        self._fetch = fetch
        self._ttl_s = ttl_s
        self._error_ttl_s = error_ttl_s
        self._keep_stale = keep_stale
        self._lock = threading.Lock()
        self._value: T | None = None
        self._error: SlurmUnavailable | None = None
        self._read_at = -float("inf")

    def get(self) -> T:
        with self._lock:
            ttl = self._error_ttl_s if self._error is not None else self._ttl_s
            if time.monotonic() - self._read_at >= ttl:
                try:
                    self._value, self._error = self._fetch(), None
                except SlurmUnavailable as exc:
                    if not (self._keep_stale and self._value is not None):
                        self._value, self._error = None, exc
                self._read_at = time.monotonic()
            if self._error is not None:
                raise self._error
            assert self._value is not None
            return self._value
