"""A job's page lists its outputs, and its downloads go through the pages' cookie routes, gated as the Files page's are.

No run-as helper here: the listing, the file and the tar are the storage
agent's answers as ``StorageClient.output_get`` and ``output_tar`` return them,
stood in for (as tests/app/test_files_page.py does for ``get``). Real outputs,
written by a job as its user and downloaded in Chromium, are
tests/live/test_job_outputs.py's.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import html
import io
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.errors import NotFound
from gpupool.models import Account, AccountMember, Job
from gpupool.storage.client import Answer, StorageClient
from gpupool.storage.paths import StoragePath
from tests.app.conftest import ACCOUNT, signed_in

JOB_ID = "00000000-0000-4000-8000-000000000001"
OTHER_ACCOUNTS_JOB = "00000000-0000-4000-8000-000000000002"
HOSTILE = '<img src=x onerror=alert(1)>#?.txt'
MTIME_NS = 1_780_000_000 * 1_000_000_000
DATA = os.urandom(70_000)
ENDED = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


@pytest.fixture
def jobs(session_factory: sessionmaker) -> None:
    """Alice's finished job in the tier's account, and a job of another account."""
    with session_factory() as session, session.begin():
        session.add(Account(name="other", gpu_limit=4, unix_user="gp-other", unix_uid=200_002))
        session.flush()
        for job_id, account, owner in ((JOB_ID, ACCOUNT, "alice"), (OTHER_ACCOUNTS_JOB, "other", "olga")):
            session.add(Job(
                id=job_id, account=account, owner=owner, name="train-1", template="command", params={}, gpus=1, cpus=1,
                mem_gb=1, time_limit_min=5, job_dir=f"/nonexistent/{account}/{job_id}", state="COMPLETED", finished=True,
                slurm_job_id=4242, submitted_at=ENDED - dt.timedelta(minutes=2), started_at=ENDED - dt.timedelta(minutes=1),
                ended_at=ENDED, exit_code=0, request_hash="0" * 64, created_at=ENDED, updated_at=ENDED,
            ))


class Outputs:
    """The storage agent's answers for the job's outputs, and what it was asked."""

    def __init__(self, tmp_path: Path) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.file = tmp_path / "data.bin"
        self.file.write_bytes(DATA)
        self.missing = False

    def get(self, account: str, job_id: str, path: StoragePath, *, limit: int = 1000,
            after: str | None = None) -> Answer:
        self.calls.append(("get", account, job_id, path.text, str(limit), str(after)))
        if self.missing:
            raise NotFound("no such file or folder: /")
        if not path.folder:
            info = self.file.stat()
            facts = {"ok": True, "size": info.st_size, "mtime_ns": info.st_mtime_ns, "ino": info.st_ino}
            return Answer(facts, os.open(self.file, os.O_RDONLY))
        entries: list[dict[str, Any]] = [
            {"name": "data.bin", "type": "file", "size": len(DATA), "mtime_ns": MTIME_NS},
            {"name": "samples", "type": "folder", "size": None, "mtime_ns": MTIME_NS},
            {"name": "shadow", "type": "link", "size": None, "mtime_ns": MTIME_NS},
            {"name": HOSTILE, "type": "file", "size": 5, "mtime_ns": MTIME_NS},
        ]
        return Answer({"ok": True, "entries": entries, "next_after": HOSTILE, "skipped": 1})

    def tar(self, account: str, job_id: str) -> Answer:
        self.calls.append(("tar", account, job_id))
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w", format=tarfile.PAX_FORMAT) as out:
            info = tarfile.TarInfo("data.bin")
            info.size = len(DATA)
            out.addfile(info, io.BytesIO(DATA))
        read_end, write_end = os.pipe()
        # Written whole before the answer: the pipe made large enough (the agent's child writes as the API reads).
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
        os.write(write_end, archive.getvalue())
        os.close(write_end)
        return Answer({"ok": True, "type": "tar"}, read_end)


@pytest.fixture
def outputs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Outputs:
    stand_in = Outputs(tmp_path)
    monkeypatch.setattr(StorageClient, "output_get", stand_in.get)
    monkeypatch.setattr(StorageClient, "output_tar", stand_in.tar)
    return stand_in


def test_the_job_page_lists_its_outputs_with_downloads_folders_and_the_tar(
    app: Flask, settings: Settings, session_factory: sessionmaker, jobs: None, outputs: Outputs,
) -> None:
    client = app.test_client()
    signed_in(client, settings, session_factory)
    page = client.get(f"/ui/jobs/{JOB_ID}")
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert outputs.calls == [("get", ACCOUNT, JOB_ID, "", "100", "None")]
    section = text[text.index('<h2 id="outputs">') : text.index("<h2>Parameters</h2>")]
    # Each file a download through the pages' data route; a folder its page of this job's page; a link never followed.
    assert f'<a class="download" href="/ui/data/jobs/{JOB_ID}/outputs/data.bin" download>data.bin</a>' in section
    assert '<td class="num size">68.4 KiB</td>' in section
    assert f'<a class="folder" href="/ui/jobs/{JOB_ID}?outputs=samples/#outputs">samples/</a>' in section
    assert 'shadow <span class="hint">(link)</span>' in section and "outputs/shadow" not in section
    assert HOSTILE not in section and html.escape(HOSTILE) in section
    assert f"/ui/data/jobs/{JOB_ID}/outputs/%3Cimg%20src=x%20onerror=alert(1)%3E%23%3F.txt" in section
    assert "1 names that are not UTF-8 are not listed" in section
    assert f'<a class="button" id="outputs-tar" href="/ui/data/jobs/{JOB_ID}/outputs.tar" download>Download all (tar)</a>' in section
    assert "kept for 7 days after the job ends" in section

    # The next page through the API's cursor; a folder's own page with the way back up.
    next_url = html.unescape(re.search(r'href="([^"]+)" id="outputs-next-page"', section).group(1))  # type: ignore[union-attr]
    assert client.get(next_url).status_code == 200
    assert outputs.calls[-1] == ("get", ACCOUNT, JOB_ID, "", "100", HOSTILE)
    folder = client.get(f"/ui/jobs/{JOB_ID}?outputs=samples/").get_data(as_text=True)
    assert outputs.calls[-1] == ("get", ACCOUNT, JOB_ID, "samples/", "100", "None")
    assert f'<a class="download" href="/ui/data/jobs/{JOB_ID}/outputs/samples/data.bin" download>' in folder
    assert f'<a href="/ui/jobs/{JOB_ID}#outputs">..</a>' in folder and "<strong>samples</strong>" in folder
    # A path trick in the page's address is the API's 400.
    tricked = client.get(f"/ui/jobs/{JOB_ID}?outputs=../../etc/")
    assert tricked.status_code == 400 and "path_invalid" in tricked.get_data(as_text=True)


def test_the_downloads_are_the_files_bytes_and_the_whole_folder_as_a_tar(
    app: Flask, settings: Settings, session_factory: sessionmaker, jobs: None, outputs: Outputs,
) -> None:
    client = app.test_client()
    signed_in(client, settings, session_factory)
    # buffered: the answer's file is read whole and closed, as a server does once sent.
    one = client.get(f"/ui/data/jobs/{JOB_ID}/outputs/data.bin", headers={"Sec-Fetch-Site": "same-origin"}, buffered=True)
    assert one.status_code == 200 and hashlib.sha256(one.get_data()).digest() == hashlib.sha256(DATA).digest()
    assert one.headers["Content-Disposition"].startswith('attachment; filename="data.bin"')
    assert one.headers["Content-Security-Policy"] == "default-src 'none'; sandbox"  # the tenant's bytes, never a page
    ranged = client.get(f"/ui/data/jobs/{JOB_ID}/outputs/data.bin", headers={"Range": "bytes=10-19"}, buffered=True)
    assert (ranged.status_code, ranged.get_data()) == (206, DATA[10:20])
    whole = client.get(f"/ui/data/jobs/{JOB_ID}/outputs.tar", headers={"Sec-Fetch-Site": "none"}, buffered=True)
    assert (whole.status_code, whole.headers["Content-Type"]) == (200, "application/x-tar")
    assert whole.headers["Content-Disposition"].startswith(f'attachment; filename="{JOB_ID}-outputs.tar"')
    with tarfile.open(fileobj=io.BytesIO(whole.get_data()), mode="r:") as archive:
        member = archive.extractfile("data.bin")
        assert member is not None and member.read() == DATA
    assert [call[0] for call in outputs.calls] == ["get", "get", "tar"]


def test_the_data_routes_answer_only_the_sites_own_pages_and_the_jobs_account(
    app: Flask, settings: Settings, session_factory: sessionmaker, jobs: None, outputs: Outputs,
) -> None:
    client = app.test_client()
    unsigned = client.get(f"/ui/data/jobs/{JOB_ID}/outputs/data.bin")
    assert (unsigned.status_code, unsigned.get_json()["error"]) == (401, "session_ended")
    signed_in(client, settings, session_factory)
    # A request another site's page started (a session's page on its own origin is one): refused before storage.
    for site in ("same-site", "cross-site"):
        for path in (f"/ui/data/jobs/{JOB_ID}/outputs/data.bin", f"/ui/data/jobs/{JOB_ID}/outputs.tar"):
            refused = client.get(path, headers={"Sec-Fetch-Site": site})
            assert (refused.status_code, refused.get_json()["error"]) == (403, "cross_origin"), (site, path)
    # Another account's job, and one that does not exist: the API's 404, as JSON.
    for job_id in (OTHER_ACCOUNTS_JOB, "00000000-0000-4000-8000-000000000009"):
        for path in (f"/ui/data/jobs/{job_id}/outputs/data.bin", f"/ui/data/jobs/{job_id}/outputs.tar"):
            missing = client.get(path)
            assert (missing.status_code, missing.get_json()["error"]) == (404, "not_found"), path
    assert outputs.calls == []
    # The JSON API never takes the page's cookie.
    assert client.get(f"/jobs/{JOB_ID}/outputs/data.bin").status_code == 401


def test_a_viewer_sees_the_job_but_not_what_it_wrote(
    app: Flask, settings: Settings, session_factory: sessionmaker, jobs: None, outputs: Outputs,
) -> None:
    now = ENDED
    with session_factory() as session, session.begin():
        for subject, role in (("ada", "admin"), ("alice", "viewer")):
            session.add(AccountMember(account=ACCOUNT, subject=subject, role=role, created_at=now, updated_at=now))
    client = app.test_client()
    signed_in(client, settings, session_factory)
    page = client.get(f"/ui/jobs/{JOB_ID}")
    assert page.status_code == 200 and 'id="outputs"' not in page.get_data(as_text=True)
    refused = client.get(f"/ui/data/jobs/{JOB_ID}/outputs.tar")
    assert (refused.status_code, refused.get_json()["error"]) == (403, "role_insufficient")
    assert outputs.calls == []


def test_a_job_without_an_output_folder_says_so(
    app: Flask, settings: Settings, session_factory: sessionmaker, jobs: None, outputs: Outputs,
) -> None:
    outputs.missing = True
    client = app.test_client()
    signed_in(client, settings, session_factory)
    text = client.get(f"/ui/jobs/{JOB_ID}").get_data(as_text=True)
    assert "No output folder: the job made none, or the site&#39;s retention has removed it." in text
    assert 'id="outputs-tar"' not in text
