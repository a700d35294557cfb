"""``GET /metrics`` for Prometheus, and the request and submit metrics behind it.

What is exported (with the core's, from ``gpupool.metrics``):

* ``gpupool_http_requests_total{method, endpoint, status}`` and
  ``gpupool_http_request_duration_seconds{method, endpoint}``; ``endpoint`` is the
  Flask endpoint (``jobs.get_job``), ``unmatched`` for paths no route serves,
  so neither job ids nor random paths become labels;
* ``gpupool_jobs_submitted_total{template}``: jobs Slurm accepted via POST /submit
  (idempotent replays are not counted again);
* ``gpupool_slurm_command_duration_seconds{command}``,
  ``gpupool_slurm_command_failures_total{command, reason}``;
* ``gpupool_job_state_refresh_passes_total{outcome}``,
  ``gpupool_job_state_refresh_duration_seconds``.

Access. Prometheus sends no token, so none is asked for; instead only callers
whose address is in ``metrics_allow_cidrs`` (default: loopback and the private
ranges) get the metrics. Anyone else gets the same 404 as a path that does not
exist: the endpoint is not advertised to the internet. An empty list turns it
off. Behind a reverse proxy every request comes from the proxy's address, so a
proxy that faces the internet must not forward ``/metrics``.

Several gunicorn workers. Each worker counts only its own requests. Start
gunicorn with ``PROMETHEUS_MULTIPROC_DIR`` set to an empty folder the service
can write (wipe it on every start, e.g. systemd ``RuntimeDirectory=``): each
worker then writes its values to files there, and ``/metrics`` from any worker
adds all of them up. gpupool exports only counters and histograms, which keep
the counts of exited workers, so no gunicorn ``child_exit`` hook is required.

Stages. With ``server_timing`` on (off by default: it tells callers how long
the service's parts take), every response carries a ``Server-Timing`` header
with the stages a request passed (``stage``: a submit's admission, budget
check, render, commit and sbatch) and its total; bench/submit reads them.
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from flask import Blueprint, Flask, Response, abort, g, request
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from api.context import app_state
from api.routing import PUBLIC, Reply, operation
from gpupool.config import Network, Settings
from gpupool.errors import ConfigError
from gpupool.metrics import MULTIPROC_ENV, exposition_registry

metrics_bp = Blueprint("metrics", __name__)

_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

HTTP_REQUESTS = Counter(
    "gpupool_http_requests_total",
    "HTTP requests answered, by method, Flask endpoint and status code.",
    ["method", "endpoint", "status"],
)
HTTP_SECONDS = Histogram(
    "gpupool_http_request_duration_seconds",
    "Time from the first request hook to the response, by method and Flask endpoint.",
    ["method", "endpoint"],
)
JOBS_SUBMITTED = Counter(
    "gpupool_jobs_submitted_total",
    "Jobs Slurm accepted through POST /submit, by template; idempotent replays are not counted.",
    ["template"],
)


def _caller_allowed(remote_addr: str | None, networks: Sequence[Network]) -> bool:
    if not remote_addr:
        return False
    try:
        address = ipaddress.ip_address(remote_addr)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)


def _start_timer() -> None:
    g.metrics_started = time.perf_counter()


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time one stage of a request for its ``Server-Timing`` header, when ``server_timing`` is on."""
    spans: list[tuple[str, float]] | None = g.get("server_timing")
    if spans is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        spans.append((name, (time.perf_counter() - started) * 1000))


def _start_server_timing() -> None:
    g.server_timing = []


def _record(response: Response) -> Response:
    spans: list[tuple[str, float]] | None = g.pop("server_timing", None)
    if spans is not None and "metrics_started" in g:
        spans.append(("total", (time.perf_counter() - g.metrics_started) * 1000))
        response.headers["Server-Timing"] = ", ".join(f"{name};dur={ms:.2f}" for name, ms in spans)
    method = request.method if request.method in _KNOWN_METHODS else "other"
    endpoint = request.endpoint or "unmatched"
    HTTP_REQUESTS.labels(method=method, endpoint=endpoint, status=str(response.status_code)).inc()
    started = g.pop("metrics_started", None)
    if started is not None:
        HTTP_SECONDS.labels(method=method, endpoint=endpoint).observe(time.perf_counter() - started)
    return response


def register_metrics(app: Flask, settings: Settings) -> None:
    """Time every request; call before any other ``before_request`` hook so refusals are timed too."""
    folder = os.environ.get(MULTIPROC_ENV)
    if folder and not os.path.isdir(folder):
        raise ConfigError(f"{MULTIPROC_ENV} names {folder}, which is not a folder; create it (empty) first")
    app.before_request(_start_timer)
    if settings.server_timing:
        app.before_request(_start_server_timing)
    app.after_request(_record)


@operation(
    metrics_bp, "GET", "/metrics", roles=PUBLIC,
    summary="Prometheus metrics; only from the addresses in metrics_allow_cidrs (404 elsewhere)",
    replies={"200": Reply("Prometheus text format")}, errors=(404,),
)
def metrics() -> Response:
    if not _caller_allowed(request.remote_addr, app_state().metrics_networks):
        abort(404)
    return Response(generate_latest(exposition_registry()), headers={"Content-Type": CONTENT_TYPE_LATEST})
