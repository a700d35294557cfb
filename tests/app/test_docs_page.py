"""``/docs``: the API reference page, served with its own files and a strict policy."""

from __future__ import annotations

import re

from flask.testing import FlaskClient

from api.docs_page import swagger_assets


def test_the_reference_page_loads_only_its_own_files_with_no_token(client: FlaskClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and page.mimetype == "text/html"
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    html = page.get_data(as_text=True)
    assert 'data-spec="/openapi.json"' in html
    assert "<script>" not in html  # no inline script: the policy forbids it
    loaded = re.findall(r'(?:src|href)="(/docs/[^"]+)"', html)
    assert sorted(loaded) == sorted(["/docs/gpupool-init.js", *(f"/docs/{name}" for name in swagger_assets())])
    for path in loaded:
        with client.get(path) as answer:  # a served file stays open until its response is closed
            assert answer.status_code == 200, path
            assert answer.headers["X-Content-Type-Options"] == "nosniff"
    with client.get("/docs/swagger-ui-bundle.js") as bundle:
        assert bundle.get_data().startswith(b"/*! For license information")


def test_only_the_files_the_page_loads_are_served(client: FlaskClient) -> None:
    for path in ("/docs/swagger-editor-bundle.js", "/docs/index.html", "/docs/..%2f..%2fpyproject.toml", "/docs/swagger-ui.js.map"):
        assert client.get(path).status_code == 404, path
