"""The Files page and its data routes in the app tier: rendering, paging links, and the gates before storage.

No run-as helper here: the listing is the storage agent's answer as
``StorageClient.get`` returns it, stood in for; every refusal tested below
comes before storage is asked. Uploads, downloads and deletes of real bytes,
as the account's Unix user, are tests/live/test_files_page.py's, in Chromium.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from api import create_app
from gpupool.clock import FrozenClock
from gpupool.config import Settings
from gpupool.db import utcnow
from gpupool.models import AccountMember
from gpupool.slurm.client import SlurmClient
from gpupool.storage.client import Answer, StorageClient
from gpupool.storage.paths import StoragePath
from tests.app.conftest import ACCOUNT, NoTenants, RecordedSlurm, signed_in

HOSTILE = '<img src=x onerror=alert(1)>#?.txt'
MTIME_NS = 1_780_000_000 * 1_000_000_000


@pytest.fixture
def storage_app(
    settings: Settings, session_factory: sessionmaker, recorded_slurm: RecordedSlurm, clock: FrozenClock, tmp_path: Path,
) -> Flask:
    slurm = SlurmClient(settings, runner=recorded_slurm, tenants=NoTenants())  # type: ignore[arg-type]
    with_storage = settings.replace(storage_root=str(tmp_path / "storage"))
    return create_app(with_storage, slurm=slurm, session_factory=session_factory, clock=clock)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, StoragePath, int, str | None]]:
    """The storage agent's answer to a listing (a folder, a file, a link and a hostile name), and what it was asked."""
    calls: list[tuple[str, StoragePath, int, str | None]] = []

    def get(self: StorageClient, account: str, path: StoragePath, *, limit: int = 1000, after: str | None = None,
            upload_offset: bool = False) -> Answer:
        calls.append((account, path, limit, after))
        entries: list[dict[str, Any]] = [
            {"name": "models", "type": "folder", "size": None, "mtime_ns": MTIME_NS},
            {"name": "weights.bin", "type": "file", "size": 3 * 1024 * 1024, "mtime_ns": MTIME_NS},
            {"name": "latest", "type": "link", "size": None, "mtime_ns": MTIME_NS},
            {"name": HOSTILE, "type": "file", "size": 5, "mtime_ns": MTIME_NS},
        ]
        return Answer({"entries": entries, "next_after": "weights.bin", "skipped": 2})

    monkeypatch.setattr(StorageClient, "get", get)
    return calls


def test_without_storage_the_page_says_so_and_the_menu_has_no_files(
    client: FlaskClient, settings: Settings, session_factory: sessionmaker,
) -> None:
    csrf = signed_in(client, settings, session_factory)
    jobs = client.get("/ui/jobs").get_data(as_text=True)
    assert 'href="/ui/files/"' not in jobs
    page = client.get("/ui/files/")
    assert page.status_code == 200
    assert "This site has no account storage" in page.get_data(as_text=True)
    # The script's upload: the API's own 404, as JSON.
    refused = client.put("/ui/data/files/a.txt", data=b"hello", headers={"X-CSRF-Token": csrf})
    assert (refused.status_code, refused.get_json()["error"]) == (404, "storage_disabled")


def test_the_page_lists_a_folder_with_links_sizes_and_the_next_page(
    storage_app: Flask, settings: Settings, session_factory: sessionmaker, asked: list[tuple[str, StoragePath, int, str | None]],
) -> None:
    client = storage_app.test_client()
    signed_in(client, settings, session_factory)
    assert 'href="/ui/files/">Files</a>' in client.get("/ui/jobs").get_data(as_text=True)

    page = client.get("/ui/files/runs/2026/")
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert page.headers["Content-Security-Policy"].startswith("default-src 'self'")
    assert asked == [(ACCOUNT, StoragePath(("runs", "2026"), True), 100, None)]
    # Breadcrumbs to each folder above, the parent, a folder's page, a file's download, a link as plain text.
    assert '<a href="/ui/files/runs/">runs</a>' in text and '<a href="/ui/files/runs/">..</a>' in text
    assert '<a class="folder" href="/ui/files/runs/2026/models/">models/</a>' in text
    assert '<a class="download" href="/ui/data/files/runs/2026/weights.bin" download>weights.bin</a>' in text
    assert '<td class="num size">3 MiB</td>' in text
    assert "latest <span class=\"hint\">(link)</span>" in text
    # A hostile name is text, and its address quotes what would end the path.
    assert HOSTILE not in text and html.escape(HOSTILE) in text
    assert "/ui/data/files/runs/2026/%3Cimg%20src=x%20onerror=alert(1)%3E%23%3F.txt" in text
    assert "2 names that are not UTF-8 are not listed" in text
    # The upload target for the script, and the next page through the API's cursor.
    assert 'data-url="/ui/data/files/runs/2026/NAME"' in text
    next_url = html.unescape(re.search(r'href="([^"]+)" id="next-page"', text).group(1))  # type: ignore[union-attr]
    client.get(next_url)
    assert asked[-1] == (ACCOUNT, StoragePath(("runs", "2026"), True), 100, "weights.bin")

    # A folder's address without its / is sent to the one with it; a path trick is the API's 400.
    moved = client.get("/ui/files/runs")
    assert (moved.status_code, moved.headers["Location"]) == (308, "/ui/files/runs/")
    tricked = client.get("/ui/files/runs/../../etc/")
    assert tricked.status_code == 400 and "path_invalid" in tricked.get_data(as_text=True)


def test_the_data_routes_take_only_the_pages_own_writes(
    storage_app: Flask, settings: Settings, session_factory: sessionmaker,
) -> None:
    client = storage_app.test_client()
    # No session: JSON the script reads, never the storage.
    unsigned = client.get("/ui/data/files/a.txt")
    assert (unsigned.status_code, unsigned.get_json()["error"]) == (401, "session_ended")
    csrf = signed_in(client, settings, session_factory)
    # A write without the page's CSRF value (a form of another site's page could send the cookie, never the header).
    for headers in ({}, {"X-CSRF-Token": "not-the-value"}):
        refused = client.put("/ui/data/files/a.txt", data=b"hello", headers=headers)
        assert (refused.status_code, refused.get_json()["error"]) == (403, "csrf_failed")
    # A request another site's page started (a session's page on its own origin is one): refused, reads too.
    for site in ("same-site", "cross-site"):
        for method in ("GET", "PUT"):
            refused = client.open("/ui/data/files/a.txt", method=method, data=b"x",
                                  headers={"Sec-Fetch-Site": site, "X-CSRF-Token": csrf})
            assert (refused.status_code, refused.get_json()["error"]) == (403, "cross_origin"), (site, method)
    # The delete form without its CSRF field: the pages' refusal.
    refused_form = client.post("/ui/files/delete", data={"path": "a.txt", "folder": ""})
    assert refused_form.status_code == 403 and "csrf_failed" in refused_form.get_data(as_text=True)
    # The JSON API never takes the page's cookie.
    assert client.get("/files/").status_code == 401


def test_a_viewer_reads_the_page_but_cannot_write(
    storage_app: Flask, settings: Settings, session_factory: sessionmaker, asked: list[tuple[str, StoragePath, int, str | None]],
) -> None:
    now = utcnow()
    with session_factory() as session, session.begin():
        for subject, role in (("ada", "admin"), ("alice", "viewer")):
            session.add(AccountMember(account=ACCOUNT, subject=subject, role=role, created_at=now, updated_at=now))
    client = storage_app.test_client()
    csrf = signed_in(client, settings, session_factory)
    assert client.get("/ui/files/").status_code == 200
    # The roles of PUT and DELETE /files, on the script's upload and on the page's forms.
    refused = client.put("/ui/data/files/a.txt", data=b"hello", headers={"X-CSRF-Token": csrf})
    assert (refused.status_code, refused.get_json()["error"]) == (403, "role_insufficient")
    form = client.post("/ui/files/delete", data={"csrf_token": csrf, "path": "a.txt", "folder": ""})
    assert form.status_code == 403 and "role_insufficient" in form.get_data(as_text=True)
