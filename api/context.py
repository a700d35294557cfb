"""Per-app state (settings, Slurm client, sessions, limits: everything the app keeps) and per-request helpers."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from flask import current_app, g
from flask_limiter import Limiter
from limits import RateLimitItem
from limits.strategies import RateLimiter
from sqlalchemy.orm import Session, sessionmaker

from api.caches import ExpiringCache, TimedCache
from gpupool.clock import Clock
from gpupool.config import Network, Settings
from gpupool.jobstate import JobStateRefresher
from gpupool.slurm.client import GpuInventory, SlurmClient
from gpupool.templates import Template
from gpupool.tokens import Principal, TokenStanding


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
    limiter: Limiter
    # Requests without a valid token, per client address (api.auth.count_unauthenticated).
    unauthenticated_limit: RateLimitItem
    # The same, counted in this process while the rate-limit store is not answering.
    unauthenticated_fallback: RateLimiter
    # Who may read /metrics (api.metrics).
    metrics_networks: tuple[Network, ...]


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
