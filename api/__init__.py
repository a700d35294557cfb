"""The gpupool HTTP API. ``gunicorn 'api:create_app()'`` serves it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flask import Flask
from flask_limiter import Limiter
from limits import parse as parse_limit
from limits.storage import MemoryStorage
from limits.strategies import FixedWindowRateLimiter
from sqlalchemy.orm import sessionmaker
from werkzeug.middleware.proxy_fix import ProxyFix

from api.admin import admin_bp
from api.alerts import alerts_bp
from api.audit import audit_bp
from api.auth import PAGE_BLUEPRINTS, PROXY_BLUEPRINTS, PUBLIC_PAGE_ENDPOINTS, authenticate, rate_limit_key
from api.billing import billing_bp
from api.caches import ExpiringCache, TimedCache
from api.context import AppState, close_db_session
from api.docs_page import docs_bp
from api.errors import register_error_handlers
from api.files import files_bp
from api.jobs import jobs_bp, submit_bp
from api.keys import keys_bp
from api.members import members_bp
from api.meta import meta_bp, templates_bp
from api.metrics import metrics_bp, register_metrics
from api.outputs import outputs_bp
from api.query import refuse_repeated_parameters
from api.routing import require_every_route_declared
from api.sessions import session_proxy_bp, sessions_bp
from api.web import register_pages
from api.webhooks import webhooks_bp
from gpupool.clock import Clock
from gpupool.config import Settings, allowed_networks, load_settings
from gpupool.db import ensure_migrated, make_engine, make_session_factory
from gpupool.errors import ConfigError
from gpupool.jobstate import JobStateRefresher
from gpupool.ratelimit_store import storage_options
from gpupool.slurm.client import SlurmClient
from gpupool.templates import load_templates
from gpupool.tokens import verification_key
from gpupool.webhooks.outbox import output_counter


def create_app(
    config: Settings | Mapping[str, Any] | None = None,
    *,
    slurm: SlurmClient | None = None,
    session_factory: sessionmaker | None = None,
    clock: Clock | None = None,
) -> Flask:
    """Build the app. ``config`` is Settings, or overrides on top of the environment.

    ``slurm``, ``session_factory`` and ``clock`` are the seams: tests pass a session
    bound to a rolled-back transaction and a frozen clock, benchmarks a Slurm client
    with counting wrappers. Without ``clock``, the settings' calendar clock (the system
    clock unless calendar_now is set).
    """
    settings = config if isinstance(config, Settings) else load_settings(overrides=config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    slurm = slurm or SlurmClient(settings)
    clock = clock or settings.calendar_clock()
    if session_factory is None:
        engine = make_engine(settings.database_url, pre_ping=settings.database_pre_ping)
        ensure_migrated(engine)
        session_factory = make_session_factory(engine)

    # No app-wide static folder: the pages serve their own (api.web), and every route is declared (api.routing).
    app = Flask("gpupool", static_folder=None)
    if settings.proxy_hops > 0:
        # Per-address rate limits need the client's address, not nginx's 127.0.0.1.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=settings.proxy_hops, x_proto=settings.proxy_hops)  # type: ignore[method-assign]
    app.config.update(
        MAX_CONTENT_LENGTH=settings.max_request_bytes,
        JSON_SORT_KEYS=False,
    )
    app.json.sort_keys = False  # type: ignore[attr-defined]
    try:
        unauthenticated_limit = parse_limit(settings.ratelimit_unauthenticated)
    except ValueError as exc:
        raise ConfigError(f"ratelimit_unauthenticated: {exc}") from exc
    limiter = Limiter(
        rate_limit_key,
        storage_uri=settings.ratelimit_storage_uri,
        storage_options=storage_options(settings),
        default_limits=[settings.ratelimit_default],
        # X-RateLimit-* headers cost a store round trip on every request;
        # a 429 still carries Retry-After (api.errors).
        headers_enabled=False,
        swallow_errors=False,
        # Redis gone (or its Sentinel's master): flask-limiter counts in this process's memory, with
        # the same limits, and goes back to the store once it answers a ping again (it retries after
        # 1, 2, 4... 32 s). Limits then hold per gunicorn worker, not per cluster: degraded, never a 503.
        in_memory_fallback_enabled=True,
        strategy="fixed-window",
        key_prefix="gpupool",
    )
    app.extensions["gpupool"] = AppState(
        settings=settings,
        slurm=slurm,
        session_factory=session_factory,
        templates=load_templates(settings.templates_dir),
        refresher=JobStateRefresher(
            session_factory,
            slurm,
            interval_s=settings.refresh_interval_s,
            # Long past any sbatch a hung slurmctld could still be working through.
            submission_grace_s=settings.slurm_submit_timeout_s * 4 + 30,
            unknown_after_s=settings.unknown_after_s,
            count_outputs=output_counter(settings),
        ),
        inventory=TimedCache(slurm.gpu_inventory, settings.cluster_shape_ttl_s, keep_stale=True),
        # Load balancers probe /readyz often; Slurm hears from each worker at most every 2 s.
        slurm_ping=TimedCache(slurm.ping, 2.0, error_ttl_s=2.0),
        verification_key=verification_key(settings),
        verified_tokens=ExpiringCache(settings.token_check_cache_s),
        token_standings=ExpiringCache(settings.token_check_cache_s),
        clock=clock,
        limiter=limiter,
        unauthenticated_limit=unauthenticated_limit,
        unauthenticated_fallback=FixedWindowRateLimiter(MemoryStorage()),
        metrics_networks=allowed_networks(settings.metrics_allow_cidrs, "metrics_allow_cidrs"),
    )
    register_error_handlers(app)
    register_metrics(app, settings)  # first request hook: refused requests are timed too
    app.teardown_appcontext(close_db_session)
    # Registered before the limiter's own hook, so limits can key on the caller.
    app.before_request(authenticate)

    limiter.init_app(app)
    app.before_request(refuse_repeated_parameters)
    # Submits have their own budget; other requests share the default one.
    limiter.limit(lambda: settings.ratelimit_submit)(submit_bp)
    limiter.exempt(meta_bp)
    limiter.exempt(docs_bp)  # the reference and its static files, like /openapi.json
    limiter.exempt(metrics_bp)  # monitoring must not depend on the rate-limit store
    # nginx asks on every proxied request; it authenticates with its key, and caching bounds the cost.
    limiter.exempt(session_proxy_bp)

    for blueprint in (
        meta_bp, docs_bp, templates_bp, submit_bp, jobs_bp, billing_bp, alerts_bp, metrics_bp, webhooks_bp, admin_bp, sessions_bp, session_proxy_bp, keys_bp, members_bp, audit_bp,
        files_bp, outputs_bp,
    ):
        app.register_blueprint(blueprint)
    register_pages(app, settings, limiter)
    # Every API route carries its roles and its document (api.routing); the pages and the proxy's answer to their own checks.
    require_every_route_declared(
        app, exempt_blueprints=PAGE_BLUEPRINTS | PROXY_BLUEPRINTS, exempt_endpoints=PUBLIC_PAGE_ENDPOINTS
    )
    return app
