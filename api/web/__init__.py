"""Web pages for customers and operators, served under /ui by the API's own app.

Server-rendered (Jinja, autoescaped), readable without JavaScript; a little
plain script (static files only, the CSP forbids inline code) refreshes job
states, follows logs and uploads files through /ui/data. The JSON API and its
bearer tokens are untouched: pages authenticate with their session cookie.
"""

from __future__ import annotations

from flask import Flask, redirect, url_for
from flask_limiter import Limiter
from werkzeug.wrappers import Response as BaseResponse

from api.web import account_pages, files_page, operator  # noqa: F401  (their routes join web_bp)
from api.web.pages import submit_job, web_bp, web_data_bp
from api.web.session import configure_sessions
from gpupool.clock import utc_text
from gpupool.config import Settings


def register_pages(app: Flask, settings: Settings, limiter: Limiter) -> None:
    configure_sessions(app, settings)
    app.register_blueprint(web_bp)
    app.register_blueprint(web_data_bp)
    # Instants on the pages read as the API writes them: gpupool.clock.utc_text.
    app.add_template_filter(utc_text, "utc")
    # A submit from the form spends the same budget as POST /submit.
    limiter.limit(lambda: settings.ratelimit_submit, methods=["POST"])(submit_job)

    app.add_url_rule("/", "web_root", _to_pages)


def _to_pages() -> BaseResponse:
    return redirect(url_for("web.index"))
