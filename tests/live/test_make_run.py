"""`make run` as a newcomer runs it (as root): the service runs as `gpupool`, demo jobs as `gp-demo`."""

from __future__ import annotations

import http.client as httpclient
import os
import pwd
import re
import signal
import subprocess
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from gpupool_client import verify_signature

from tests.conftest import REPO, sacct_row, wait_for
from tests.live.conftest import free_port, http
from tests.support.receiver import serve_webhooks

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_make_run_serves_as_the_service_user_and_runs_demo_jobs_as_the_demo_tenant(tmp_path: Path) -> None:
    port, sessions_port = free_port(), free_port()
    output = tmp_path / "run-demo.log"
    with open(output, "wb") as log:
        process = subprocess.Popen(
            [str(REPO / "deploy" / "local" / "run-demo.sh")],
            cwd=REPO,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.environ.get("HOME", "/root"), "GPUPOOL_PORT": str(port),
                 "GPUPOOL_SESSIONS_PORT": str(sessions_port)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    stack = ExitStack()
    try:
        token = wait_for(
            lambda: (m := re.search(r"export TOKEN=(\S+)", output.read_text(errors="replace"))) and m.group(1),
            timeout_s=120,
            what=f"run-demo.sh to print a token:\n{output.read_text(errors='replace')}",
        )
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url), timeout_s=60, what="the API to answer")
        gunicorn_users = {
            pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
            for pid in _children(process.pid)
            if b"gunicorn" in Path(f"/proc/{pid}/cmdline").read_bytes()
        }
        assert gunicorn_users == {"gpupool"}

        # The customer's receiver on loopback, which make run lets in: the sender it runs delivers job.ended.
        receiver = stack.enter_context(serve_webhooks())
        registered = http("POST", url + "/webhooks", token=token, body={"url": receiver.url, "events": ["job.ended"]})
        assert registered.status == 201, registered.body

        created = http("POST", url + "/submit", token=token, body={"template": "hello", "gpus": 1, "params": {"message": "make run", "seconds": 1}})
        assert created.status == 201, created.body
        def completed() -> dict | None:
            reply = http("GET", f"{url}/jobs/{created.body['job_id']}", token=token)
            assert reply.status == 200, (reply.status, reply.body, output.read_text(errors="replace")[-3000:])
            return reply.body if reply.body["state"] == "COMPLETED" else None

        done = wait_for(completed, timeout_s=90, what="the demo job to complete")
        assert sacct_row(done["slurm_job_id"], "User,Account") == {"User": "gp-demo", "Account": "demo"}
        [delivery] = wait_for(lambda: receiver.deliveries, timeout_s=60, what=f"job.ended at the receiver:\n{output.read_text(errors='replace')[-3000:]}")
        event = verify_signature(delivery.body, delivery.headers["Gpupool-Signature"], registered.body["secret"])
        assert (event["type"], event["data"]["job"]["job_id"], event["data"]["job"]["state"]) == ("job.ended", done["job_id"], "COMPLETED")
        assert "make run" in http("GET", f"{url}/jobs/{done['job_id']}/logs", token=token).body
        # Your data, as the printed commands put a file in the demo account's storage and take it back.
        printed = output.read_text(errors="replace")
        assert "Your data:" in printed and "/files/docs/README.md" in printed
        readme = (REPO / "README.md").read_bytes()
        stored = urllib.request.urlopen(urllib.request.Request(
            url + "/files/docs/README.md", data=readme, method="PUT", headers={"Authorization": f"Bearer {token}"}
        ), timeout=30)
        assert stored.status in (200, 201)
        listing = http("GET", url + "/files/docs/", token=token).body
        assert [(entry["name"], entry["size"]) for entry in listing["entries"]] == [("README.md", len(readme))]
        with urllib.request.urlopen(urllib.request.Request(
            url + "/files/docs/README.md", headers={"Authorization": f"Bearer {token}"}
        ), timeout=30) as fetched:
            assert fetched.read() == readme
        assert http("GET", url + "/usage", token=token).body["storage"]["quota_bytes"] == 1024**3
        # The dashboard's address is printed beside the token, and it answers.
        assert f"{url}/ui/" in output.read_text(errors="replace")
        assert http("GET", f"{url}/ui/", timeout_s=10).status == 200

        # A session, as the printed example starts it, through make run's nginx on SQLite.
        command = 'exec python3 -m http.server --bind 127.0.0.1 "$GPUPOOL_APP_PORT"'
        started = http("POST", url + "/submit", token=token, body={"template": "webapp", "params": {"command": command}})
        assert started.status == 201, started.body
        session_url = f"{url}/jobs/{started.body['job_id']}/session"
        session = wait_for(
            lambda: (body := http("GET", session_url, token=token).body)["state"] == "ready" and body,
            timeout_s=120, what="the session to be ready",
        )
        host = session["url"].split("://", 1)[1].rstrip("/")
        assert host.endswith(f".sessions.localhost:{sessions_port}")
        status, set_cookie, body = _via_nginx(sessions_port, host, "/" + session["link"].split("/", 3)[3])
        assert status == 200 and b'<meta http-equiv="refresh" content="0; url=/">' in body, (status, body)
        status, _, body = _via_nginx(sessions_port, host, "/", set_cookie.split(";", 1)[0])
        assert status == 200 and b"Directory listing" in body, (status, body)
        http("DELETE", f"{url}/jobs/{started.body['job_id']}", token=token)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        stack.close()


def _via_nginx(port: int, host: str, path: str, cookie: str | None = None) -> tuple[int, str, bytes]:
    """A GET to make run's nginx with the session's host name: status, Set-Cookie, body."""
    conn = httpclient.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": host, **({"Cookie": cookie} if cookie else {})})
        response = conn.getresponse()
        return response.status, response.getheader("Set-Cookie", ""), response.read()
    finally:
        conn.close()


def _answers(url: str) -> bool:
    try:
        return http("GET", url + "/healthz", timeout_s=2).status == 200
    except OSError:
        return False


def _children(root: int) -> list[int]:
    """Every descendant of ``root``, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        current = frontier.pop()
        kids = [pid for pid, parent in parents.items() if parent == current]
        found += kids
        frontier += kids
    return found
