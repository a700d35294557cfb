"""billing.invoice reads a server-side cursor one batch ahead, in a thread: same batches, same order, same errors."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from billing.invoice import _read_ahead


def fetcher(batches: list[Sequence[Any]], fail_after: int | None = None) -> tuple[Callable[[], Sequence[Any]], list[int]]:
    """A cursor's fetchmany over ``batches``, then empty; it raises once ``fail_after`` batches are out."""
    calls: list[int] = []

    def fetch() -> Sequence[Any]:
        calls.append(len(calls))
        if fail_after is not None and len(calls) > fail_after:
            raise RuntimeError("server closed the connection unexpectedly")
        return batches[len(calls) - 1] if len(calls) <= len(batches) else []

    return fetch, calls


def reading_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "invoice-read-ahead"]


def test_every_batch_in_order_then_the_thread_is_gone() -> None:
    fetch, calls = fetcher([[1, 2], [3], [4, 5, 6]])
    assert list(_read_ahead(fetch)) == [[1, 2], [3], [4, 5, 6]]
    assert len(calls) == 4  # the empty batch ends it
    assert reading_threads() == []


def test_an_error_of_the_cursor_reaches_the_caller_after_the_batches_before_it() -> None:
    fetch, _ = fetcher([[1], [2], [3]], fail_after=2)
    received = []
    with pytest.raises(RuntimeError, match="server closed the connection"):
        for batch in _read_ahead(fetch):
            received.append(batch)
    assert received == [[1], [2]]
    assert reading_threads() == []


def test_a_caller_that_stops_early_stops_the_thread() -> None:
    fetch, calls = fetcher([[n] for n in range(100)])
    batches = _read_ahead(fetch)
    assert next(batches) == [0]
    batches.close()
    assert reading_threads() == []
    assert len(calls) <= 3  # the one handed over, at most one waiting and one being fetched
