"""The rate-limit store (Redis, through Sentinel or not): how the API connects to it, and whether it answers.

flask-limiter and ``gpupool status`` read the same URI with the same library (``limits``), so
the two never disagree about what "the store answers" means.
"""

from __future__ import annotations

from typing import Any

from limits.storage import storage_from_string
from redis.backoff import NoBackoff
from redis.retry import Retry

from gpupool.config import Settings


def storage_options(settings: Settings) -> dict[str, Any]:
    """Timeouts for a Redis store: redis-py waits forever by default, so a hung Redis would hang every request."""
    if not settings.ratelimit_storage_uri.startswith("redis"):
        return {}  # memory:// takes none; other stores name their options differently
    timeout = settings.ratelimit_storage_timeout_s
    # No retries: each would add another timeout to a request that falls back to memory anyway.
    options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": Retry(NoBackoff(), 0)}
    if settings.ratelimit_storage_uri.startswith("redis+sentinel"):
        # redis+sentinel://s1:26379,s2:26379/mymaster: the same bounds on asking the Sentinels who leads.
        # (redis-py's default retries with backoff: 8 s a request with the Sentinels gone.)
        options["sentinel_kwargs"] = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": Retry(NoBackoff(), 0)}
    return options


def store_state(settings: Settings) -> str:
    """``memory`` (one process's own counts: a single host), ``ok`` (the store answers a ping) or ``down``."""
    if settings.ratelimit_storage_uri.startswith("memory"):
        return "memory"
    store = storage_from_string(settings.ratelimit_storage_uri, **storage_options(settings))
    return "ok" if store.check() else "down"
