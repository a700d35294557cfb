"""A job's outputs come back through the API, read as the job's own Unix user: the kernel decides, links stay links.

A real job of the `command` template writes random bytes, a folder and a link
to /etc/shadow to $GPUPOOL_OUTPUT_DIR ($GPUPOOL_JOB_DIR/output, there before
its command runs), as the account's Unix user with the job's umask, so the
service user itself cannot read them (asserted below). gunicorn runs as that
service user under no_new_privs and reaches them only through the run-as
helper's storage agent, run as the job folder's owner. The job's page in
headless Chromium lists them and downloads one, and the whole folder, through
its links.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from gpupool_client import Client
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from bench.support.http import http
from bench.support.services import TENANT_PREFIX
from bench.support.tenancy import SERVICE_USER
from gpupool import db
from tests.conftest import base_settings, recorded_token, wait_for
from tests.live import test_browser
from tests.live.conftest import Server, launch_gunicorn, live_env, stop_gunicorn
from tests.live.test_browser import severe_console_messages, sign_in
from tests.live.test_storage import as_user, raw_request

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CLI = str(Path(sys.executable).parent / "gpupool-client")
GPUPOOL = str(Path(sys.executable).parent / "gpupool")
# Headless Chromium (tests.live.test_browser), for the job page's test.
browser = test_browser.browser

DATA_BYTES = 300_000
SCRIPT = (
    'set -e\n'
    # Made by gpupool's script before the command: a plain mkdir inside it needs it there.
    'test "$GPUPOOL_OUTPUT_DIR" = "$GPUPOOL_JOB_DIR/output"\n'
    'out="$GPUPOOL_OUTPUT_DIR"\n'
    'mkdir "$out/sub"\n'
    f'head -c {DATA_BYTES} /dev/urandom > "$out/data.bin"\n'
    'echo nested > "$out/sub/nested.txt"\n'
    'ln -s /etc/shadow "$out/shadow"\n'
    'sha256sum "$out/data.bin" | cut -d" " -f1\n'
)


@pytest.fixture(scope="module")
def server(live_db: str, job_root: Path, runas_socket: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """gunicorn (threads, as production) as the service user, with the session's run-as helper."""
    started = launch_gunicorn(
        tmp_path_factory.mktemp("outputs-gunicorn"), live_env(live_db, job_root, runas_socket), workers=2, as_service=True,
        extra_args=("--worker-class", "gthread", "--threads", "4"),
    )
    yield started
    stop_gunicorn(started)


@pytest.fixture(scope="module")
def tokens(live_db: str, slurm_account: str, tenant_b: str) -> dict[str, str]:
    settings = base_settings(database_url=f"postgresql://postgres@127.0.0.1:5432/{live_db}")
    return {account: recorded_token(settings, sub=f"user-{account}", account=account) for account in (slurm_account, tenant_b)}


@pytest.fixture(scope="module")
def finished_job(server: Server, tokens: dict[str, str], slurm_account: str) -> tuple[str, str]:
    """The job's id and the SHA-256 its own process printed of data.bin."""
    token = tokens[slurm_account]
    job = http("POST", server.url + "/submit", token=token, body={"template": "command", "gpus": 1, "params": {"command": SCRIPT}})
    assert job.status == 201, job.body
    job_id = job.body["job_id"]
    final = wait_for(
        lambda: (lambda body: body if body["state"] in ("COMPLETED", "FAILED", "CANCELLED") else None)(
            http("GET", f"{server.url}/jobs/{job_id}", token=token).body
        ),
        timeout_s=120, what="the job to end",
    )
    log = http("GET", f"{server.url}/jobs/{job_id}/logs", token=token).body
    assert final["state"] == "COMPLETED", log
    return job_id, log.split()[-1]


def fetch(server: Server, path: str, token: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """Status, headers and the body's bytes (chunked answers joined, as any HTTP client does)."""
    request = urllib.request.Request(server.url + path, method=method, headers={"Authorization": f"Bearer {token}", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def names(listing: Any) -> dict[str, str]:
    return {entry["name"]: entry["type"] for entry in listing["entries"]}


def test_the_service_user_itself_cannot_read_what_the_job_wrote(finished_job: tuple[str, str], job_root: Path, slurm_account: str) -> None:
    job_id, _ = finished_job
    done = as_user(SERVICE_USER, "cat", str(job_root / slurm_account / job_id / "output" / "data.bin"))
    assert done.returncode != 0 and "Permission denied" in done.stderr


def test_outputs_are_listed_and_come_back_whole_and_by_range(server: Server, tokens: dict[str, str], slurm_account: str, finished_job: tuple[str, str]) -> None:
    job_id, printed = finished_job
    token = tokens[slurm_account]
    top = http("GET", f"{server.url}/jobs/{job_id}/outputs/", token=token)
    assert top.status == 200, top.body
    assert names(top.body) == {"data.bin": "file", "sub": "folder", "shadow": "link"}
    assert [entry["size"] for entry in top.body["entries"] if entry["name"] == "data.bin"] == [DATA_BYTES]
    assert names(http("GET", f"{server.url}/jobs/{job_id}/outputs/sub/", token=token).body) == {"nested.txt": "file"}
    page = http("GET", f"{server.url}/jobs/{job_id}/outputs/?limit=1", token=token).body
    assert names(page) == {"data.bin": "file"} and page["next_cursor"]

    status, headers, body = fetch(server, f"/jobs/{job_id}/outputs/data.bin", token)
    assert (status, sha(body)) == (200, printed)
    assert headers["content-type"] == "application/octet-stream" and headers["etag"]
    status, ranged, part = fetch(server, f"/jobs/{job_id}/outputs/data.bin", token, {"Range": "bytes=1000-1999"})
    assert (status, ranged["content-range"], part) == (206, f"bytes 1000-1999/{DATA_BYTES}", body[1000:2000])
    status, head, empty = fetch(server, f"/jobs/{job_id}/outputs/data.bin", token, method="HEAD")
    assert (status, head["content-length"], head["etag"], empty) == (200, str(DATA_BYTES), headers["etag"], b"")
    assert fetch(server, f"/jobs/{job_id}/outputs/data.bin", token, {"If-None-Match": headers["etag"]})[0] == 304
    assert fetch(server, f"/jobs/{job_id}/outputs/sub/nested.txt", token)[2] == b"nested\n"


def test_the_link_to_etc_shadow_is_never_followed(server: Server, tokens: dict[str, str], slurm_account: str, finished_job: tuple[str, str]) -> None:
    job_id, _ = finished_job
    status, _, body = fetch(server, f"/jobs/{job_id}/outputs/shadow", tokens[slurm_account])
    assert status == 404 and b"root:" not in body


def test_the_whole_folder_comes_as_one_tar_with_the_link_as_a_link(server: Server, tokens: dict[str, str], slurm_account: str, finished_job: tuple[str, str]) -> None:
    job_id, printed = finished_job
    for path in (f"/jobs/{job_id}/outputs.tar", f"/jobs/{job_id}/outputs/?format=tar"):
        status, headers, stream = fetch(server, path, tokens[slurm_account])
        assert (status, headers["content-type"]) == (200, "application/x-tar"), stream[:200]
        assert b"root:" not in stream
        with tarfile.open(fileobj=io.BytesIO(stream), mode="r:") as archive:
            members = {member.name: member for member in archive.getmembers()}
            assert sorted(members) == ["data.bin", "shadow", "sub", "sub/nested.txt"]
            data = archive.extractfile("data.bin")
            assert data is not None and sha(data.read()) == printed
            assert members["shadow"].issym() and members["shadow"].linkname == "/etc/shadow"
            assert members["sub"].isdir()


def test_another_account_and_unknown_jobs_get_404(server: Server, tokens: dict[str, str], tenant_b: str, finished_job: tuple[str, str]) -> None:
    job_id, _ = finished_job
    theirs = tokens[tenant_b]
    for path in (f"/jobs/{job_id}/outputs/", f"/jobs/{job_id}/outputs/data.bin", f"/jobs/{job_id}/outputs/sub/",
                 f"/jobs/{job_id}/outputs.tar", f"/jobs/{job_id}/outputs/?format=tar",
                 "/jobs/00000000-0000-4000-8000-000000000000/outputs/"):
        status, headers, body = fetch(server, path, theirs)
        assert (status, headers["content-type"]) == (404, "application/json"), (path, body[:200])
    assert fetch(server, f"/jobs/{job_id}/outputs/data.bin", theirs, method="HEAD")[0] == 404


def test_path_tricks_are_refused_with_json(server: Server, tokens: dict[str, str], slurm_account: str, finished_job: tuple[str, str]) -> None:
    job_id, _ = finished_job
    token = tokens[slurm_account]
    for trick in ("../../../etc/passwd", "sub/%2e%2e/%2e%2e/stdout.log", "a%00b", "/etc/passwd", "sub//nested.txt", "n" * 256):
        status, _, body = raw_request(server, "GET", f"/jobs/{job_id}/outputs/{trick}", token)
        assert status == 400 and body["error"] == "path_invalid", (trick, status, body)
    status, _, body = raw_request(server, "GET", f"/jobs/{job_id}/outputs/sub/?format=tar", token)
    assert status == 400 and body["error"], body


def test_the_client_and_its_cli_take_the_outputs_home(
    server: Server, tokens: dict[str, str], slurm_account: str, finished_job: tuple[str, str], tmp_path: Path,
) -> None:
    job_id, printed = finished_job
    env = {"PATH": "/usr/bin:/bin", "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": tokens[slurm_account]}
    with Client(server.url, tokens[slurm_account]) as client:
        found = {entry["path"]: entry["type"] for entry in client.output_files(job_id)}
        assert found == {"data.bin": "file", "shadow": "link", "sub": "folder", "sub/nested.txt": "file"}
        one = client.download_output(job_id, "data.bin", tmp_path / "one.bin")
        assert sha(one.read_bytes()) == printed
        with open(tmp_path / "all.tar", "wb") as out:
            written = client.outputs_tar(job_id, out)
        assert written == (tmp_path / "all.tar").stat().st_size > DATA_BYTES
        with tarfile.open(tmp_path / "all.tar") as archive:
            assert sorted(archive.getnames()) == ["data.bin", "shadow", "sub", "sub/nested.txt"]

    listed = subprocess.run([CLI, "outputs", job_id], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0, listed.stderr
    assert [line.split(None, 2)[2] for line in listed.stdout.splitlines()] == [
        "data.bin", "shadow -> (link, not followed)", "sub/", "sub/nested.txt",
    ]
    dest = tmp_path / "home"
    fetched = subprocess.run([CLI, "outputs", job_id, "--dest", str(dest)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert fetched.returncode == 0, fetched.stderr
    assert sha((dest / "data.bin").read_bytes()) == printed and (dest / "sub" / "nested.txt").read_bytes() == b"nested\n"
    assert not (dest / "shadow").exists() and not (dest / "shadow").is_symlink()
    assert "shadow: a link, not downloaded" in fetched.stderr
    single = subprocess.run([CLI, "outputs", job_id, "sub/nested.txt", "--dest", str(tmp_path / "single")],
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert single.returncode == 0 and (tmp_path / "single" / "nested.txt").read_bytes() == b"nested\n", single.stderr
    missing = subprocess.run([CLI, "outputs", "00000000-0000-4000-8000-000000000000"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode != 0 and "no job" in missing.stderr


def downloaded(folder: Path, name: str, size: int | None = None) -> Path:
    """The file Chromium saved under its final name (it writes a .crdownload until the download is whole)."""
    saved = folder / name
    wait_for(lambda: saved.exists() and (size is None or saved.stat().st_size == size), timeout_s=60, what=f"{name} downloaded")
    return saved


def page_outputs(driver: WebDriver) -> dict[str, Any]:
    """The job page's Outputs rows, by name."""
    return {row.get_attribute("data-name") or "": row for row in driver.find_elements(By.CSS_SELECTOR, "#outputs-list tbody tr[data-name]")}


@test_browser.pytestmark
def test_the_job_page_lists_the_outputs_and_its_links_download_the_same_bytes(
    server: Server, browser: WebDriver, tokens: dict[str, str], slurm_account: str, finished_job: tuple[str, str], tmp_path: Path,
) -> None:
    job_id, printed = finished_job
    downloads = tmp_path / "downloads"
    sign_in(browser, server, tokens[slurm_account])
    browser.get(f"{server.url}/ui/jobs/{job_id}")
    rows = page_outputs(browser)
    assert sorted(rows) == ["data.bin", "shadow", "sub"]
    assert rows["data.bin"].find_element(By.CSS_SELECTOR, "td.size").text == "293.0 KiB"
    assert rows["shadow"].find_elements(By.TAG_NAME, "a") == []  # a link is listed, never followed

    # The file's link: the bytes the job's own process hashed.
    rows["data.bin"].find_element(By.CSS_SELECTOR, "a.download").click()
    assert sha(downloaded(downloads, "data.bin", DATA_BYTES).read_bytes()) == printed
    # Download all: one tar of the folder, the link as a link.
    browser.find_element(By.ID, "outputs-tar").click()
    archive_path = downloaded(downloads, f"{job_id}-outputs.tar")
    wait_for(lambda: archive_path.stat().st_size > DATA_BYTES, timeout_s=30, what="the whole archive")
    with tarfile.open(archive_path, mode="r:") as archive:
        assert sorted(archive.getnames()) == ["data.bin", "shadow", "sub", "sub/nested.txt"]
        data = archive.extractfile("data.bin")
        assert data is not None and sha(data.read()) == printed
    # A folder opens in place, and its file downloads too.
    rows["sub"].find_element(By.CSS_SELECTOR, "a.folder").click()
    wait_for(lambda: "nested.txt" in page_outputs(browser), timeout_s=15, what="the sub folder's listing")
    assert browser.current_url.endswith(f"/ui/jobs/{job_id}?outputs=sub/#outputs")
    page_outputs(browser)["nested.txt"].find_element(By.CSS_SELECTOR, "a.download").click()
    assert downloaded(downloads, "nested.txt", 7).read_bytes() == b"nested\n"
    assert severe_console_messages(browser) == []


def test_retention_removes_the_folder_of_a_job_over_long_enough_never_what_its_links_point_to(
    server: Server, tokens: dict[str, str], slurm_account: str, finished_job: tuple[str, str], live_db: str, job_root: Path,
    runas_socket: str, tmp_path: Path,
) -> None:
    """Last in this module: it removes the job's folder the tests above read."""
    job_id, _ = finished_job
    folder = job_root / slurm_account / job_id
    outside = tmp_path / "keep-me"
    outside.write_bytes(b"not the job's")
    planted = as_user(TENANT_PREFIX + slurm_account, "ln", "-s", str(outside), str(folder / "output" / "to-outside"))
    assert planted.returncode == 0, planted.stderr
    env = {**live_env(live_db, job_root, runas_socket), "GPUPOOL_JOB_OUTPUT_RETENTION_DAYS": "7"}

    def prune(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([GPUPOOL, "outputs", "prune", *args], env=env, capture_output=True, text=True, timeout=120, check=False)

    kept = prune("--all")
    assert (kept.returncode, kept.stdout.splitlines()[-1]) == (0, "0 job folder(s) removed, 0 failed"), kept.stderr
    assert folder.is_dir()
    engine = db.make_engine(env["GPUPOOL_DATABASE_URL"])
    with engine.begin() as connection:
        connection.execute(
            sa.text("UPDATE jobs SET ended_at = :ended WHERE id = :id"),
            {"ended": db.utcnow() - dt.timedelta(days=8), "id": job_id},
        )
    engine.dispose()
    told = prune("--dry-run")
    assert told.returncode == 0 and f"would remove the folder of job {job_id}" in told.stdout and folder.is_dir(), told.stderr
    removed = prune()
    assert removed.returncode == 0 and f"removed the folder of job {job_id}" in removed.stdout, removed.stderr
    assert not os.path.lexists(folder)
    assert outside.read_bytes() == b"not the job's" and Path("/etc/shadow").is_file()
    status, headers, _ = fetch(server, f"/jobs/{job_id}/outputs/", tokens[slurm_account])
    assert (status, headers["content-type"]) == (404, "application/json")
    again = prune("--all")
    assert again.stdout.splitlines()[-1] == "0 job folder(s) removed, 0 failed"
