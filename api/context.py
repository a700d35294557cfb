"""Per-app state (settings, Slurm client, sessions) and per-request helpers."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from flask import current_app, g
from sqlalchemy.orm import Session, sessionmaker

from gpupool.clock import Clock
from gpupool.config import Settings
from gpupool.errors import SlurmUnavailable
from gpupool.expiring_cache import ExpiringCache
from gpupool.jobstate import JobStateRefresher
from gpupool.slurm import GpuInventory, SlurmClient
from gpupool.templates import Template
from gpupool.tokens import Principal, TokenStanding

T = TypeVar("T")


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


@dataclass
class AppState:
    settings: Settings
    slurm: SlurmClient
    session_factory: sessionmaker
    templates: dict[str, Template]
    refresher: JobStateRefresher
    inventory: TimedCache[GpuInventory]
    slurm_ping: TimedCache[bool]
    verification_key: str
    verified_tokens: ExpiringCache[str, Principal]
    token_standings: ExpiringCache[str, TokenStanding | None]
    # "Now" for decisions by the calendar: this month's usage, budgets, report windows.
    clock: Clock


def app_state() -> AppState:
    return current_app.extensions["gpupool"]


def calendar_now() -> dt.datetime:
    """The app clock's "now", for decisions by the calendar (see gpupool.clock)."""
    return app_state().clock()


def db_session() -> Session:
    """The request's one session, opened on first use and closed at teardown."""
    if "db_session" not in g:
        g.db_session = app_state().session_factory()
    return g.db_session


def close_db_session(_exc: BaseException | None = None) -> None:
    session = g.pop("db_session", None)
    if session is not None:
        session.close()


def principal() -> Principal:
    return g.principal
