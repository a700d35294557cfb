"""``/docs``: the API reference, the OpenAPI document rendered by Swagger UI.

Swagger UI's files come from the ``swagger-ui-py`` distribution (Swagger UI 5,
which reads OpenAPI 3.1), served from this process: no CDN, and a page that
works on a cluster with no way out. Its page has no inline script, so the
Content-Security-Policy stays as strict as the web pages' except for styles,
which Swagger UI sets inline. The documentation site (``make docs``) renders
the same document with the same files (docs/_hooks/openapi.py).
"""

from __future__ import annotations

from html import escape
from pathlib import Path

import swagger_ui
from flask import Blueprint, Response, abort, send_from_directory

from api.routing import PUBLIC, Reply, operation, public_asset

docs_bp = Blueprint("docs", __name__)

_STATIC = Path(swagger_ui.__file__).resolve().parent / "static"
# Only what the page loads; the bundle's other files (the editor, source maps) are not served.
_ASSETS = ("swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "swagger-ui.css", "favicon-32x32.png")
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# Reads the document's address from the page, so the page itself needs no inline script.
INIT_SCRIPT = """\
window.addEventListener("load", function () {
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.spec,
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    layout: "StandaloneLayout",
  });
});
"""


def swagger_assets() -> dict[str, Path]:
    """The Swagger UI files the page loads, by the name it loads them with."""
    return {name: _STATIC / name for name in _ASSETS}


def swagger_index(spec_url: str, assets_url: str) -> str:
    """The page: Swagger UI over the OpenAPI document at ``spec_url``, its files under ``assets_url``."""
    base = escape(assets_url, quote=True)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>gpupool API reference</title>
<link rel="stylesheet" href="{base}swagger-ui.css">
<link rel="icon" type="image/png" href="{base}favicon-32x32.png">
</head>
<body>
<div id="swagger-ui" data-spec="{escape(spec_url, quote=True)}"></div>
<script src="{base}swagger-ui-bundle.js"></script>
<script src="{base}swagger-ui-standalone-preset.js"></script>
<script src="{base}gpupool-init.js"></script>
</body>
</html>
"""


def _secured(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


@operation(
    docs_bp, "GET", "/docs", roles=PUBLIC, summary="This document, rendered by Swagger UI", replies={"200": Reply("An HTML page")}
)
def reference() -> Response:
    return _secured(Response(swagger_index("/openapi.json", "/docs/"), mimetype="text/html"))


@public_asset(docs_bp, "/docs/gpupool-init.js")
def init_script() -> Response:
    return _secured(Response(INIT_SCRIPT, mimetype="text/javascript"))


@public_asset(docs_bp, "/docs/<name>")
def asset(name: str) -> Response:
    if name not in _ASSETS:
        abort(404)
    return _secured(send_from_directory(_STATIC, name, max_age=86400))
