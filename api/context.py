"""Per-app state (settings, Slurm client, sessions) and per-request helpers."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from flask import current_app, g
from sqlalchemy.orm import Session, sessionmaker

from gpupool.config import Settings
from gpupool.errors import SlurmUnavailable
from gpupool.jobstate import JobStateRefresher
from gpupool.slurm import GpuInventory, SlurmClient
from gpupool.templates import Template
from gpupool.tokens import Principal


@dataclass
class InventoryCache:
    """The cluster's GPU shape, read from sinfo at most once per TTL per process."""

    slurm: SlurmClient
    ttl_s: float
    _value: GpuInventory | None = None
    _read_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self) -> GpuInventory:
        with self._lock:
            if self._value is None or time.monotonic() - self._read_at > self.ttl_s:
                try:
                    self._value = self.slurm.gpu_inventory()
                    self._read_at = time.monotonic()
                except SlurmUnavailable:
                    if self._value is None:
                        raise
                    # A stale shape is better than refusing every submit while Slurm blinks.
            return self._value


@dataclass
class AppState:
    settings: Settings
    slurm: SlurmClient
    session_factory: sessionmaker
    templates: dict[str, Template]
    refresher: JobStateRefresher
    inventory: InventoryCache
    verification_key: str


def state() -> AppState:
    return current_app.extensions["gpupool"]


def db_session() -> Session:
    """The request's one session, opened on first use and closed at teardown."""
    if "db_session" not in g:
        g.db_session = state().session_factory()
    return g.db_session


def close_db_session(_exc: BaseException | None = None) -> None:
    session = g.pop("db_session", None)
    if session is not None:
        session.close()


def principal() -> Principal:
    return g.principal
