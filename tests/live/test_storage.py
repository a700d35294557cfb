"""Each account's storage, on the real cluster and the kernel, as production runs it.

gunicorn runs as the unprivileged service user under no_new_privs and reaches
an account's files only through the run-as helper, which opens them as the
account's Unix user. Every volume is a real ext4 filesystem in a loop-mounted
image, its size the account's quota. The tests assert what a customer sees
(HTTP codes, bodies, the bytes themselves by SHA-256) and what the kernel
answers a tenant's own process.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pwd
import socket
import stat
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.support.http import http
from bench.support.services import TENANT_PREFIX, throwaway_member_user
from bench.support.storage import account_volumes, storage_helper, storage_root_for_tests
from bench.support.tenancy import SERVICE_USER
from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from gpupool.storage.volumes import volume_usage
from tests.conftest import base_settings, recorded_token, wait_for
from tests.live.conftest import Server, launch_gunicorn, live_env, stop_gunicorn

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

QUOTA = 32 * 1024 * 1024


@pytest.fixture(scope="module")
def storage_root() -> Iterator[Path]:
    with storage_root_for_tests() as root:
        yield root


@pytest.fixture(scope="module")
def storage_settings(storage_root: Path, job_root: Path) -> Settings:
    return base_settings(storage_root=str(storage_root), job_root=str(job_root))


@pytest.fixture(scope="module")
def volumes(storage_settings: Settings, slurm_account: str, tenant_b: str, live_db: str) -> Iterator[tuple[str, str]]:
    """Accounts A (the session's) and B, each with a 32 MiB volume."""
    with account_volumes(storage_settings, f"postgresql://postgres@127.0.0.1:5432/{live_db}", [slurm_account, tenant_b], QUOTA):
        yield slurm_account, tenant_b


@pytest.fixture(scope="module")
def server(
    live_db: str, job_root: Path, storage_root: Path, volumes: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    """The helper knowing the storage root, and gunicorn (threads, as production) as the service user."""
    with storage_helper(job_root, storage_root, tmp_path_factory.mktemp("storage-runas")) as helper:
        env = live_env(live_db, job_root, helper)
        env.update(GPUPOOL_STORAGE_ROOT=str(storage_root))
        started = launch_gunicorn(
            tmp_path_factory.mktemp("storage-gunicorn"), env, workers=2, as_service=True,
            extra_args=("--worker-class", "gthread", "--threads", "4"),
        )
        yield started
        stop_gunicorn(started)


@pytest.fixture(scope="module")
def tokens(live_db: str, volumes: tuple[str, str]) -> dict[str, str]:
    settings = base_settings(database_url=f"postgresql://postgres@127.0.0.1:5432/{live_db}")
    return {account: recorded_token(settings, sub=f"user-{account}", account=account) for account in volumes}


def url(server: Server, path: str) -> str:
    return f"{server.url}/files/{urllib.parse.quote(path)}"


def put(server: Server, token: str, path: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """A PUT with a raw body (tests.support.http sends JSON)."""
    status, _, body = raw_request(server, "PUT", f"/files/{urllib.parse.quote(path)}", token, data, headers)
    return status, body


def raw_request(
    server: Server, method: str, target: str, token: str, body: bytes = b"", headers: dict[str, str] | None = None,
    *, declared_length: int | None = None,
) -> tuple[int, dict[str, str], Any]:
    sock = open_request(server, method, target, token, body, headers, declared_length=declared_length)
    with sock:
        return read_answer(sock)


def open_request(
    server: Server, method: str, target: str, token: str, body: bytes, headers: dict[str, str] | None = None,
    *, declared_length: int | None = None,
) -> socket.socket:
    """A request on its own connection, its body (or the first part of it) sent; the caller reads or drops it."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    length = len(body) if declared_length is None else declared_length
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Authorization: Bearer {token}", f"Content-Length: {length}",
             "Connection: close", *(f"{name}: {value}" for name, value in (headers or {}).items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return sock


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    received = b""
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        received += chunk
    head, _, payload = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in header_lines)}
    try:
        return int(status_line.split()[1]), headers, json.loads(payload)
    except ValueError:
        return int(status_line.split()[1]), headers, payload


def download(server: Server, token: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    status, got, body = raw_request(server, "GET", f"/files/{urllib.parse.quote(path)}", token, headers=headers)
    return status, got, body if isinstance(body, bytes) else repr(body).encode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload_offset(server: Server, token: str, path: str) -> int:
    _, headers, _ = raw_request(server, "HEAD", f"/files/{urllib.parse.quote(path)}", token)
    return int(headers.get("upload-offset", "-1"))


def as_tenant(account: str, *argv: str, cwd: str = "/") -> subprocess.CompletedProcess[str]:
    """``argv`` as the account's Unix user, as any process of one of its jobs runs."""
    return as_user(TENANT_PREFIX + account, *argv, cwd=cwd)


def as_user(user: str, *argv: str, cwd: str = "/") -> subprocess.CompletedProcess[str]:
    """``argv`` as ``user`` with its own groups, as its jobs run."""
    return subprocess.run(
        ["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}", "--init-groups", "--", *argv],
        capture_output=True, text=True, timeout=60, check=False, cwd=cwd, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )


FILL = (
    "import errno, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)\n"
    "block = b'x' * (1 << 20)\n"
    "try:\n"
    "    while True:\n"
    "        os.write(fd, block)\n"
    "except OSError as exc:\n"
    "    print(errno.errorcode[exc.errno])\n"
)


def fill_volume(storage_root: Path, account: str, name: str) -> str:
    """Write as the account's own process until the kernel refuses; the error's name."""
    done = as_tenant(account, "/usr/bin/python3", "-c", FILL, str(storage_root / account / name))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_random_bytes_come_back_whole_and_by_range(server: Server, tokens: dict[str, str], volumes: tuple[str, str]) -> None:
    token = tokens[volumes[0]]
    data = os.urandom(5 * 1024 * 1024 + 123)
    status, body = put(server, token, "sets/random.bin", data)
    assert status == 201, body
    assert body["size"] == len(data) and body["path"] == "sets/random.bin"
    status, headers, got = download(server, token, "sets/random.bin")
    assert (status, sha(got)) == (200, sha(data))
    assert headers["content-type"] == "application/octet-stream" and headers["x-content-type-options"] == "nosniff"
    assert headers["etag"] == body["etag"]
    for asked, expected in (("bytes=100-1048675", data[100:1048676]), ("bytes=-1000", data[-1000:]), ("bytes=5242000-", data[5242000:])):
        status, headers, got = download(server, token, "sets/random.bin", {"Range": asked})
        assert status == 206, asked
        assert sha(got) == sha(expected), asked
        assert headers["content-range"].endswith(f"/{len(data)}")
    status, headers, _ = download(server, token, "sets/random.bin", {"Range": f"bytes={len(data)}-"})
    assert (status, headers["content-range"]) == (416, f"bytes */{len(data)}")
    assert download(server, token, "sets/random.bin", {"If-None-Match": body["etag"]})[0] == 304
    # Replaced: the next reader gets the new bytes, under a new ETag.
    again = os.urandom(1000)
    status, replaced = put(server, token, "sets/random.bin", again)
    assert status == 200 and replaced["etag"] != body["etag"]
    assert sha(download(server, token, "sets/random.bin")[2]) == sha(again)
    listing = http("GET", url(server, "sets/"), token=token).body
    assert listing["entries"] == [{"name": "random.bin", "type": "file", "size": 1000, "modified": replaced["modified"]}]


def test_an_interrupted_upload_is_invisible_then_resumed_whole(server: Server, tokens: dict[str, str], volumes: tuple[str, str]) -> None:
    token = tokens[volumes[0]]
    data = os.urandom(3 * 1024 * 1024)
    half = len(data) // 2
    # The client dies halfway: the connection closes with half the declared body sent.
    open_request(server, "PUT", "/files/resumed.bin", token, data[:half], declared_length=len(data)).close()
    wait_for(lambda: upload_offset(server, token, "resumed.bin") == half, timeout_s=30, what="the first half to be kept")
    assert download(server, token, "resumed.bin")[0] == 404  # nothing under its name until it is whole
    assert "resumed.bin" not in str(http("GET", url(server, ""), token=token).body)
    # Resumed, and cut again; one upload of a path at a time: another while it is still sending is refused.
    # (The server writes the body a MiB at a time.)
    kept = half + (1 << 20)
    sending = open_request(server, "PUT", "/files/resumed.bin", token, data[half:kept], {"Upload-Offset": str(half)},
                           declared_length=len(data) - half)
    wait_for(lambda: upload_offset(server, token, "resumed.bin") == kept, timeout_s=30, what="the resumed upload to write")
    status, busy = put(server, token, "resumed.bin", b"other bytes")
    assert (status, busy["error"]) == (409, "upload_in_progress")
    sending.close()

    def refused_for_its_offset() -> tuple[int, Any] | None:
        answer = put(server, token, "resumed.bin", data[half:], {"Upload-Offset": str(half)})
        return None if answer[1].get("error") == "upload_in_progress" else answer  # the cut not yet seen

    status, wrong = wait_for(refused_for_its_offset, timeout_s=30, what="the cut upload to be released")
    assert (status, wrong["error"], wrong["offset"]) == (409, "upload_offset_mismatch", kept)
    status, done = put(server, token, "resumed.bin", data[kept:], {"Upload-Offset": str(kept)})
    assert status == 201, done
    assert sha(download(server, token, "resumed.bin")[2]) == sha(data)
    assert upload_offset(server, token, "resumed.bin") == 0


def test_a_job_reads_an_upload_and_writes_a_file_the_api_serves_but_its_links_are_not_followed(
    server: Server, tokens: dict[str, str], volumes: tuple[str, str], storage_root: Path,
) -> None:
    a, b = volumes
    token = tokens[a]
    data = os.urandom(200_000)
    assert put(server, token, "in/input.bin", data)[0] == 201
    assert put(server, tokens[b], "secret.txt", b"b's secret")[0] == 201
    script = (
        'set -e\n'
        'sha256sum "$GPUPOOL_DATA/in/input.bin" | cut -d" " -f1 > "$GPUPOOL_DATA/in/seen.txt"\n'
        'mkdir -p "$GPUPOOL_DATA/out" && head -c 4096 /dev/urandom > "$GPUPOOL_DATA/out/result.bin"\n'
        'sha256sum "$GPUPOOL_DATA/out/result.bin" | cut -d" " -f1\n'
        'ln -s /etc/shadow "$GPUPOOL_DATA/out/shadow"\n'
        f'ln -s {storage_root / b}/secret.txt "$GPUPOOL_DATA/out/b-secret"\n'
        'ln -s / "$GPUPOOL_DATA/out/root"\n'
        'mkfifo "$GPUPOOL_DATA/out/fifo"\n'
        'echo "$GPUPOOL_DATA"\n'
    )
    job = http("POST", server.url + "/submit", token=token, body={"template": "command", "gpus": 1, "params": {"command": script}})
    assert job.status == 201, job.body
    job_id = job.body["job_id"]
    final = wait_for(
        lambda: (lambda body: body if body["state"] in ("COMPLETED", "FAILED") else None)(http("GET", f"{server.url}/jobs/{job_id}", token=token).body),
        timeout_s=120, what="the job to end",
    )
    log = http("GET", f"{server.url}/jobs/{job_id}/logs", token=token).body
    assert final["state"] == "COMPLETED", log
    result_sum, data_dir = log.split()[-2:]
    assert data_dir == str(storage_root / a)
    status, _, seen = download(server, token, "in/seen.txt")
    assert (status, seen.decode().strip()) == (200, sha(data))
    status, _, result = download(server, token, "out/result.bin")
    assert (status, sha(result)) == (200, result_sum)
    listing = {entry["name"]: entry["type"] for entry in http("GET", url(server, "out/"), token=token).body["entries"]}
    assert listing == {"result.bin": "file", "shadow": "link", "b-secret": "link", "root": "link", "fifo": "other"}
    for planted in ("out/shadow", "out/b-secret", "out/root/etc/shadow", "out/fifo", "out/root/"):
        status, _, body = download(server, token, planted)
        assert status == 404, (planted, body)
        assert b"root:" not in body and b"b's secret" not in body
    # A link is the tenant's own name: it can be deleted (never what it points to).
    assert raw_request(server, "DELETE", "/files/out/shadow", token)[0] == 204
    assert Path("/etc/shadow").exists()


def test_another_account_gets_404_for_everything_of_the_first(server: Server, tokens: dict[str, str], volumes: tuple[str, str]) -> None:
    a, b = volumes
    data = os.urandom(10_000)
    assert put(server, tokens[a], "private/a.bin", data)[0] == 201
    theirs = tokens[b]
    assert download(server, theirs, "private/a.bin")[0] == 404
    assert http("GET", url(server, "private/"), token=theirs).status == 404
    assert raw_request(server, "DELETE", "/files/private/a.bin", theirs)[0] == 404
    assert raw_request(server, "POST", "/files/private/a.bin?move_to=mine.bin", theirs)[0] == 404
    # B writing the same path writes B's own file; A's bytes do not change.
    assert put(server, theirs, "private/a.bin", b"b's bytes")[0] == 201
    assert sha(download(server, tokens[a], "private/a.bin")[2]) == sha(data)
    assert download(server, theirs, "private/a.bin")[2] == b"b's bytes"
    # Path tricks: refused before anything opens them, whoever asks.
    tricks = ("/files/../" + a + "/private/a.bin", "/files/private/%2e%2e/%2e%2e/etc/passwd", "/files/a%00b",
              "/files//etc/passwd", "/files/private//a.bin", "/files/" + "n" * 256, "/files/.gpupool-uploads/")
    for method in ("GET", "PUT", "DELETE"):
        for target in tricks:
            status, _, body = raw_request(server, method, target, theirs, b"x" if method == "PUT" else b"")
            assert (status, body["error"]) == (400, "path_invalid"), (method, target, body)
    # The top of the storage is listed, never written, deleted or moved: the document's 405.
    for method in ("PUT", "DELETE", "POST"):
        assert raw_request(server, method, "/files/", theirs, b"x" if method == "PUT" else b"")[0] == 405, method


def test_the_kernel_refuses_a_tenant_past_its_quota_and_every_other_user_at_the_door(
    server: Server, volumes: tuple[str, str], storage_root: Path,
) -> None:
    a, b = volumes
    # Past the quota, by any process of the account: the filesystem is full (its volume's size is the quota).
    assert fill_volume(storage_root, a, "filler") == errno.errorcode[errno.ENOSPC]
    assert (storage_root / a / "filler").stat().st_size <= QUOTA
    (storage_root / a / "filler").unlink()
    # Another account's process, and the service itself, are refused by the kernel at the account's folder.
    denied = as_tenant(b, "/bin/ls", str(storage_root / a))
    assert denied.returncode != 0 and "Permission denied" in denied.stderr
    service = subprocess.run(
        ["setpriv", f"--reuid={SERVICE_USER}", f"--regid={SERVICE_USER}", "--init-groups", "--", "/bin/ls", str(storage_root / a)],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert service.returncode != 0 and "Permission denied" in service.stderr


def test_an_upload_past_the_quota_is_507_and_leaves_nothing(
    server: Server, tokens: dict[str, str], volumes: tuple[str, str], storage_root: Path, storage_settings: Settings,
) -> None:
    a = volumes[0]
    token = tokens[a]
    # Declared too large: refused before a byte is written.
    status, body = put(server, token, "toolarge.bin", os.urandom(QUOTA))
    assert (status, body["error"]) == (507, "storage_quota_exceeded")
    assert download(server, token, "toolarge.bin")[0] == 404
    # Filled while it streams: the kernel refuses a write in the middle; the upload's bytes go.
    total = 6 * 1024 * 1024
    data = os.urandom(total)
    sending = open_request(server, "PUT", "/files/midway.bin", token, data[: 1 << 20], declared_length=total)
    with sending:
        wait_for(lambda: upload_offset(server, token, "midway.bin") >= 1 << 20, timeout_s=30, what="the first MiB to be written")
        assert fill_volume(storage_root, a, "filler") == errno.errorcode[errno.ENOSPC]
        sending.sendall(data[1 << 20:])
        status, _, body = read_answer(sending)
    assert (status, body["error"]) == (507, "storage_quota_exceeded"), body
    (storage_root / a / "filler").unlink()
    assert download(server, token, "midway.bin")[0] == 404
    assert upload_offset(server, token, "midway.bin") == 0
    names = [entry["name"] for entry in http("GET", url(server, ""), token=token).body["entries"]]
    assert "midway.bin" not in names and "toolarge.bin" not in names
    # /usage: the quota, and what the filesystem says is stored (its own count, no walk).
    storage = http("GET", server.url + "/usage", token=token).body["storage"]
    measured = volume_usage(storage_settings, a)
    assert measured is not None
    assert storage["quota_bytes"] == QUOTA
    assert storage["stored_bytes"] == measured.stored_bytes and storage["available_bytes"] == measured.available_bytes


def test_members_write_the_accounts_storage_and_viewers_only_read_it(
    server: Server, tokens: dict[str, str], volumes: tuple[str, str], live_db: str,
) -> None:
    a = volumes[0]
    assert put(server, tokens[a], "shared/plan.txt", b"the plan")[0] in (200, 201)
    for subject, role in (("member-m", "member"), ("viewer-v", "viewer")):
        added = http("PUT", f"{server.url}/account/members/{subject}", token=tokens[a], body={"role": role})
        assert added.status == 200, added.body
    settings = base_settings(database_url=f"postgresql://postgres@127.0.0.1:5432/{live_db}")
    member = recorded_token(settings, a, sub="member-m")
    viewer = recorded_token(settings, a, sub="viewer-v")
    assert download(server, viewer, "shared/plan.txt")[2] == b"the plan"
    status, body = put(server, viewer, "shared/plan.txt", b"changed")
    assert (status, body["error"]) == (403, "role_insufficient")
    assert raw_request(server, "DELETE", "/files/shared/plan.txt", viewer)[0] == 403
    assert put(server, member, "shared/plan.txt", b"changed by a member")[0] == 200
    assert download(server, viewer, "shared/plan.txt")[2] == b"changed by a member"
    for subject in ("member-m", "viewer-v", f"user-{a}"):
        http("DELETE", f"{server.url}/account/members/{subject}", token=tokens[a])


def test_what_a_members_job_writes_is_the_accounts_to_share(
    server: Server, tokens: dict[str, str], volumes: tuple[str, str], storage_root: Path, slurm: SlurmClient,
) -> None:
    """A member's own user (gpupool member migrate) writes with a job's umask (0077); the account shares it."""
    a = volumes[0]
    with throwaway_member_user(slurm, a) as member:
        written = as_user(
            member.user, "/bin/sh", "-c",
            'umask 077 && mkdir -p "$0/team" && head -c 3000 /dev/urandom > "$0/team/by-member.bin" && sha256sum "$0/team/by-member.bin"',
            str(storage_root / a),
        )
        assert written.returncode == 0, written.stderr
        made = (storage_root / a / "team" / "by-member.bin").stat()
        assert (made.st_uid, stat.S_IMODE(made.st_mode)) == (member.uid, 0o660)  # the group's, through the default ACL
        assert stat.S_IMODE((storage_root / a / "team").stat().st_mode) == 0o770
        # The API, opening as the account's own user, serves it; the account's user writes beside it.
        status, _, body = download(server, tokens[a], "team/by-member.bin")
        assert (status, sha(body)) == (200, written.stdout.split()[0])
        assert as_tenant(a, "/bin/sh", "-c", f'echo mine > "{storage_root / a}/team/by-account.txt"').returncode == 0
        assert as_user(member.user, "/bin/cat", str(storage_root / a / "team" / "by-account.txt")).stdout == "mine\n"
        # Another account's users, members or not, stay out.
        assert "Permission denied" in as_tenant(volumes[1], "/bin/ls", str(storage_root / a)).stderr
