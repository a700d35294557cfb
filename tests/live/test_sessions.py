"""Interactive sessions on the real cluster, through a real nginx with gpupool's rendered config.

The session runs the `webapp` template with a small app of this test's own
(stdlib HTTP with a WebSocket echo), as the account's tenant, behind
gpupool's shim. Every request here goes to nginx on a loopback port with the
session's own host name, as a browser resolving ``*.localhost`` would send it.
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import http.client as httpclient
import io
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import text

from bench.support.http import as_service_user_argv, free_port
from bench.support.processes import NGINX
from bench.support.services import TENANT_PREFIX, cancel_account_jobs, slurm_cmd
from bench.support.tenancy import ensure_service_user
from gpupool import db
from gpupool.config import Settings
from gpupool.proc import run_command
from gpupool.proxy import ProxyConfig, standalone_nginx_conf
from gpupool.sessions import COOKIE_NAME, node_address, shim_status
from tests.conftest import recorded_token, sacct_row, wait_for
from tests.live import test_browser
from tests.live.conftest import Server, http
from tests.support.gpu_exporter import serve_exporter

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
# Headless Chromium, from the browser tests next door.
browser = test_browser.browser

PROXY_KEY = "proxy-key-" + "p" * 40
GPUPOOL = Path(sys.executable).parent / "gpupool"
GPUPOOL_CLIENT = Path(sys.executable).parent / "gpupool-client"
# The test's own app: it says which job it runs in and whether the secret reached it, and echoes WebSocket frames.
APP = r'''
import base64, hashlib, json, os, struct, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
SEEN = []
SEEN_LOCK = threading.Lock()
# What an app may set: a cookie of its own origin (kept); what nginx drops: a wider Domain, gpupool's names.
TOSSED = ["kept=1; Path=/", "tossed=1; Domain=sessions.localhost; Path=/", "gpupool_session_grant=evil; Path=/",
          "gpupool_session=evil; Path=/", "__Host-gpupool_session_grant=evil; Secure; Path=/"]

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        with SEEN_LOCK:
            SEEN.append(self.command + " " + self.path)
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.echo()
        if self.path == "/seen":
            return self.reply(json.dumps(SEEN).encode())
        body = json.dumps({
            "path": self.path,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "secret_seen": self.headers.get("X-Gpupool-Session-Secret"),
            "cookie": self.headers.get("Cookie"),
            "host": self.headers.get("Host"),
        }).encode()
        self.reply(body, TOSSED if self.path == "/toss" else [])

    def do_POST(self):
        with SEEN_LOCK:
            SEEN.append(self.command + " " + self.path)
        self.reply(self.rfile.read(int(self.headers.get("Content-Length", "0"))))

    def reply(self, body, cookies=()):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        for cookie in cookies:
            self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def echo(self):
        accept = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.send_header("Set-Cookie", "wstossed=1; Domain=sessions.localhost; Path=/")
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            length = head[1] & 0x7F
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if head[0] & 0x0F == 8:
                return
            reply = b"echo:" + data
            self.wfile.write(bytes([0x81, len(reply)]) + reply)
            self.wfile.flush()

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(os.environ["GPUPOOL_APP_PORT"])), Handler).serve_forever()
'''


@dataclass
class Proxy:
    port: int
    domain: str
    process: subprocess.Popen
    state_dir: Path

    def host(self, label: str) -> str:
        return f"{label}.{self.domain}:{self.port}"

    def log(self) -> str:
        return (self.state_dir / "error.log").read_text(errors="replace")


@dataclass
class Answer:
    status: int
    headers: httpclient.HTTPMessage
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


def through_proxy(
    proxy: Proxy, host: str, path: str, *, cookie: str | None = None, headers: dict[str, str] | None = None,
    method: str = "GET", body: bytes | None = None,
) -> Answer:
    """A request to nginx with the session's host name, as a browser sends it (a GET unless told)."""
    conn = httpclient.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        sent = {"Host": host, **(headers or {})}
        if cookie is not None:
            sent["Cookie"] = f"{COOKIE_NAME}={cookie}"
        conn.request(method, path, body=body, headers=sent)
        reply = conn.getresponse()
        return Answer(reply.status, reply.headers, reply.read())
    finally:
        conn.close()


def label_of(session: dict) -> str:
    return session["url"].split("://", 1)[1].split(".", 1)[0]


def cookie_from(answer: Answer) -> str:
    set_cookie = answer.headers.get("Set-Cookie", "")
    name, _, rest = set_cookie.partition("=")
    assert name == COOKIE_NAME, set_cookie
    attributes = [part.strip().lower() for part in rest.split(";")[1:]]
    assert "httponly" in attributes and "path=/" in attributes and "samesite=strict" in attributes, set_cookie
    assert not any(part.startswith("domain=") for part in attributes), set_cookie  # this origin alone
    return rest.split(";", 1)[0]


def websocket_echo(
    proxy: Proxy, host: str, cookie: str, message: bytes, *, origin: str | None = None, heads: list[bytes] | None = None
) -> tuple[int, bytes]:
    """Open a WebSocket through nginx, send one masked frame, read the answer frame: (HTTP status, payload).

    Sent as a browser sends it from the session's own page (its Origin), unless ``origin`` says
    another; the answer's head goes into ``heads`` when given."""
    key = base64.b64encode(secrets.token_bytes(16)).decode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
        sock.sendall(
            (f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             f"Origin: {origin or 'http://' + host}\r\n"
             f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nCookie: {COOKIE_NAME}={cookie}\r\n\r\n").encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
        if heads is not None:
            heads.append(head)
        status = int(head.split(b" ", 2)[1])
        if status != 101:
            return status, b""
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        assert accept in head, head
        mask = secrets.token_bytes(4)
        sock.sendall(bytes([0x81, 0x80 | len(message)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(message)))
        rest = head.split(b"\r\n\r\n", 1)[1]
        while len(rest) < 2 or len(rest) < 2 + rest[1]:
            rest += sock.recv(4096)
        return status, rest[2 : 2 + rest[1]]


@pytest.fixture(scope="module")
def app_dir() -> Iterator[Path]:
    """The test app, where the tenants can read it (pytest's folders are root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="gpupool-session-app-", dir="/var/tmp"))
    root.chmod(0o755)
    (root / "app.py").write_text(APP)
    (root / "app.py").chmod(0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def queue_of_its_own(slurm_account: str, tenant_b: str) -> Iterator[None]:
    """Each test starts with both accounts' queues empty and leaves them so.

    slurm_account lives for the whole pytest session and the local cluster has
    four GPUs: a session an earlier test left running (webapp's time limit is an
    hour) would keep this test's session pending, not ready.
    """
    for name in (slurm_account, tenant_b):
        cancel_account_jobs(name, timeout_s=120)
    yield
    for name in (slurm_account, tenant_b):
        cancel_account_jobs(name, timeout_s=120)


def queue_report() -> str:
    """What Slurm says about every job and node, for a failure message."""
    return "\n".join([
        slurm_cmd("squeue", "-a", "-o", "%i %a %T %r %b %N", check=False),
        slurm_cmd("sinfo", "-N", "-o", "%N %T %G %E", check=False),
    ])


@pytest.fixture
def session_templates_dir() -> str | None:
    """The server's templates: the shipped ones (a module may give its own)."""
    return None


def start_proxy(server: Server, **limits: int) -> Proxy:
    """nginx with the role's config for this server, as the unprivileged service user, on a port of its own."""
    if not Path(NGINX).exists():
        pytest.fail("nginx is missing: `make venv-test` installs nginx-light (deploy/local/bootstrap-venv.sh)")
    port = int(server.env["GPUPOOL_SESSIONS_URL"].rsplit(":", 1)[1]) if not limits else free_port()
    domain = "sessions.localhost"
    user = ensure_service_user()
    state_dir = Path(tempfile.mkdtemp(prefix="gpupool-nginx-", dir="/var/tmp"))
    config = ProxyConfig(
        sessions_domain=domain, api_url=server.url, public_api_url=server.url, proxy_key=PROXY_KEY,
        listen=(f"127.0.0.1:{port}",), **limits,
    )
    (state_dir / "nginx.conf").write_text(standalone_nginx_conf(config, state_dir))
    for path in [state_dir, *state_dir.rglob("*")]:
        os.chown(path, user.pw_uid, user.pw_gid)
    # nginx as the unprivileged service user, as nothing but a port above 1024 needs root.
    process = subprocess.Popen(
        [*as_service_user_argv(), NGINX, "-p", str(state_dir), "-c", str(state_dir / "nginx.conf")],
        stdout=subprocess.DEVNULL, stderr=open(state_dir / "stderr.log", "wb"), start_new_session=True,
    )
    proxy = Proxy(port, domain, process, state_dir)

    def listening() -> bool:
        assert process.poll() is None, (state_dir / "stderr.log").read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(listening, timeout_s=30, what="nginx to listen")
    return proxy


def stop_proxy(proxy: Proxy) -> None:
    os.killpg(proxy.process.pid, signal.SIGTERM)
    proxy.process.wait(timeout=15)
    shutil.rmtree(proxy.state_dir, ignore_errors=True)


@contextmanager
def serving_sessions(start_server: Callable[..., Server], **settings: str) -> Iterator[tuple[Server, Proxy]]:
    """The API with sessions on, and nginx in front of them; ``settings`` are the API's own besides."""
    port = free_port()
    server = start_server(
        session_proxy_key=PROXY_KEY, sessions_url=f"http://sessions.localhost:{port}", session_ports="20000-29999",
        webhook_allow_cidrs="127.0.0.0/8", **settings,
    )
    proxy = start_proxy(server)
    try:
        yield server, proxy
    finally:
        stop_proxy(proxy)


@pytest.fixture
def api_and_proxy(start_server: Callable[..., Server], session_templates_dir: str | None) -> Iterator[tuple[Server, Proxy]]:
    with serving_sessions(start_server, **({} if session_templates_dir is None else {"templates_dir": session_templates_dir})) as both:
        yield both


def start_session(server: Server, token: str, app_dir: Path, **extra: object) -> dict:
    command = f'exec python3 {app_dir / "app.py"}'
    reply = http("POST", server.url + "/submit", token=token, body={"template": "webapp", "gpus": 1, "params": {"command": command}, **extra})
    assert reply.status == 201, reply.body
    assert reply.body["session"] is True
    job_id = reply.body["job_id"]

    def ready() -> dict | None:
        session = http("GET", f"{server.url}/jobs/{job_id}/session", token=token).body
        assert session["state"] in ("starting", "ready"), session
        return session if session["state"] == "ready" else None

    try:
        return wait_for(ready, timeout_s=180, interval_s=1, what="the session to be ready")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{queue_report()}") from exc


def path_of(link: str) -> str:
    return "/" + link.split("://", 1)[1].split("/", 1)[1]


def test_webapp_session_through_nginx(
    api_and_proxy: tuple[Server, Proxy], live_settings: Settings, slurm_account: str, tenant_b: str, app_dir: Path,
) -> None:
    server, proxy = api_and_proxy
    token = recorded_token(live_settings, slurm_account, sub=f"s-{secrets.token_hex(3)}")
    other_token = recorded_token(live_settings, tenant_b, sub=f"s-{secrets.token_hex(3)}")
    session = start_session(server, token, app_dir)
    job = http("GET", f"{server.url}/jobs/{session['job_id']}", token=token).body
    label = label_of(session)
    host = proxy.host(label)
    assert session["url"] == f"http://{host}/"

    # No cookie: sent to sign in to gpupool, which brings the browser back with a new link.
    unsigned = through_proxy(proxy, host, "/")
    assert unsigned.status == 302, (unsigned.status, unsigned.body, proxy.log())
    assert unsigned.headers["Location"] == f"{server.url}/ui/sessions/{label}/open"

    # The single-use link sets the cookie of this origin alone, once, and a page of this origin goes on to /
    # (a redirect would not: a Strict cookie goes on no request of a navigation another site began).
    link = path_of(session["link"])
    opened = through_proxy(proxy, host, link)
    assert opened.status == 200 and b'<meta http-equiv="refresh" content="0; url=/">' in opened.body, (opened.status, opened.body)
    cookie = cookie_from(opened)
    again = through_proxy(proxy, host, link)
    assert again.status == 404 and "Set-Cookie" not in again.headers

    # Through nginx and the shim to the app, in the job Slurm runs; the secret stops at the shim.
    page = through_proxy(
        proxy, host, "/some/path?x=1", headers={"X-Gpupool-Session-Secret": "forged", "Cookie": f"app=1; {COOKIE_NAME}={cookie}; theme=dark"}
    )
    assert page.status == 200, (page.status, page.body, proxy.log())
    seen = page.json()
    # The app gets its own cookies, never gpupool's grant, and never the secret.
    assert seen == {
        "path": "/some/path?x=1", "slurm_job_id": str(job["slurm_job_id"]), "secret_seen": None, "host": host, "cookie": "app=1; theme=dark",
    }

    # A WebSocket through the proxy, checked like every request; the shim counts it while open. The app's
    # handshake sets a cookie for the whole sessions domain: nginx drops it.
    heads: list[bytes] = []
    status, echoed = websocket_echo(proxy, host, cookie, b"hello over ws", heads=heads)
    assert (status, echoed) == (101, b"echo:hello over ws")
    assert b"wstossed" not in heads[0] and b"set-cookie" not in heads[0].lower(), heads
    assert websocket_echo(proxy, host, "not-a-cookie", b"x")[0] == 404

    # Another account: its token gets the API's 404, its own session's cookie the proxy's 404,
    # the same answer as a session that does not exist.
    assert http("GET", f"{server.url}/jobs/{session['job_id']}/session", token=other_token).status == 404
    other = start_session(server, other_token, app_dir)
    other_cookie = cookie_from(through_proxy(proxy, proxy.host(label_of(other)), path_of(other["link"])))
    assert through_proxy(proxy, proxy.host(label_of(other)), "/", cookie=other_cookie).status == 200
    refused = through_proxy(proxy, host, "/", cookie=other_cookie)
    missing = through_proxy(proxy, proxy.host("0" * 20), "/", cookie=cookie)
    assert refused.status == missing.status == 404 and refused.body == missing.body
    assert through_proxy(proxy, host, "/", cookie="x" * 43).body == missing.body
    # The other account's link does not open this session either.
    fresh_other = http("GET", f"{server.url}/jobs/{other['job_id']}/session", token=other_token).body
    assert through_proxy(proxy, host, path_of(fresh_other["link"])).status == 404

    # The browser's headers on requests a page of the other session (a sibling: same site) sends here with
    # this session's own cookie: nginx refuses each before gpupool is asked, and the app never hears of them.
    own, sibling = f"http://{host}", f"http://{proxy.host(label_of(other))}"
    posted = through_proxy(proxy, host, "/own-post", cookie=cookie, method="POST", body=b"mine", headers={"Origin": own, "Sec-Fetch-Site": "same-origin"})
    assert (posted.status, posted.body) == (200, b"mine")
    refused = [
        through_proxy(proxy, host, "/sibling-post", cookie=cookie, method="POST", body=b"x", headers={"Origin": sibling, "Sec-Fetch-Site": "same-site"}),
        through_proxy(proxy, host, "/sibling-post-no-fetch-site", cookie=cookie, method="POST", body=b"x", headers={"Origin": sibling}),
        through_proxy(proxy, host, "/no-origin-put", cookie=cookie, method="PUT", body=b"x"),
        through_proxy(proxy, host, "/sibling-get", cookie=cookie, headers={"Sec-Fetch-Site": "same-site"}),
    ]
    assert [answer.status for answer in refused] == [403] * 4, [(a.status, a.body) for a in refused]
    assert refused[0].json()["error"] == "cross_origin" and "its own pages" in refused[0].json()["message"]
    assert websocket_echo(proxy, host, cookie, b"x", origin=sibling)[0] == 403
    seen = through_proxy(proxy, host, "/seen", cookie=cookie).json()
    assert "POST /own-post" in seen and not [line for line in seen if "sibling" in line or "no-origin" in line], seen

    # An app's cookies for a wider domain, or in gpupool's names, never reach the browser; its own do.
    tossing = through_proxy(proxy, proxy.host(label_of(other)), "/toss", cookie=other_cookie)
    assert tossing.status == 200 and tossing.headers.get_all("Set-Cookie") == ["kept=1; Path=/"], tossing.headers.get_all("Set-Cookie")
    # Two grant cookies (one a sibling's script set for the parent domain): a 400 that says so, whatever their order.
    for pair in (f"{COOKIE_NAME}={cookie}; {COOKIE_NAME}=tossed", f"{COOKIE_NAME}=tossed; theme=dark; {COOKIE_NAME}={cookie}"):
        twice = through_proxy(proxy, host, "/", headers={"Cookie": pair})
        assert twice.status == 400 and twice.json()["error"] == "duplicate_cookie", (twice.status, twice.body)

    # A flood from one address is cut at nginx (here an nginx of this server with small limits): 429, JSON.
    strict = start_proxy(server, rate_per_s=1, burst=5, link_rate_per_min=1, link_burst=2)
    try:
        flood = [through_proxy(strict, strict.host(label), "/", cookie=secrets.token_urlsafe(32)) for _ in range(40)]
        links = [through_proxy(strict, strict.host(label), "/.gpupool/open?link=made-up") for _ in range(10)]
    finally:
        stop_proxy(strict)
    assert {answer.status for answer in flood} == {404, 429} and {answer.status for answer in links} == {404, 429}
    assert flood[-1].json() == {"error": "rate_limited", "message": "too many requests to the sessions from your address; try again in a moment"}

    # From the other tenant's uid on the same node, straight to the session's port: the shim's refusal.
    address = node_address(job["node"])
    record_port = session_port(server, token, session)
    probe = (
        "import socket,sys\n"
        f"s = socket.create_connection(({address!r}, {record_port}), timeout=10)\n"
        "s.sendall(b'GET / HTTP/1.1\\r\\nHost: x\\r\\nX-Gpupool-Session-Secret: guessed\\r\\n\\r\\n')\n"
        "sys.stdout.write(s.recv(200).decode())\n"
    )
    direct = run_command(
        ["/usr/sbin/runuser", "-u", TENANT_PREFIX + tenant_b, "--", "/usr/bin/python3", "-c", probe],
        timeout_s=30, env={"PATH": "/usr/bin:/bin"}, check=False,
    )
    assert direct.stdout.startswith("HTTP/1.1 403 Forbidden"), (direct.stdout, direct.stderr)
    assert "secret is missing or wrong" in direct.stdout

    # Every TCP port the session's tenant listens on, seen from the other tenant's uid, on loopback
    # and on the node's address: the shim's 403 or a refusal; the app (in its own network namespace) never.
    tenant_uid = pwd.getpwnam(TENANT_PREFIX + slurm_account).pw_uid
    ports = listening_ports(tenant_uid)
    assert record_port in ports, (record_port, ports)
    answers = probe_ports(TENANT_PREFIX + tenant_b, sorted({"127.0.0.1", address}), ports)
    assert answers and all(first == "refused" or first.startswith("HTTP/1.1 403 Forbidden") for first in answers.values()), answers
    assert answers[f"{address}:{record_port}"].startswith("HTTP/1.1 403 Forbidden"), answers

    # nginx's endpoints are closed to anyone without the proxy's key.
    assert http("GET", server.url + "/session-proxy/auth", headers={"X-Gpupool-Session": label, "Cookie": f"{COOKIE_NAME}={cookie}"}).status == 404


# Run on a session's own page: a write and a WebSocket of its own, which go through.
OWN_PAGE_SCRIPT = """
const done = arguments[arguments.length - 1];
const out = {};
(async () => {
  const posted = await fetch('/own-post', {method: 'POST', body: 'mine'});
  out.post = posted.status + ' ' + await posted.text();
  out.ws = await new Promise((resolve) => {
    const ws = new WebSocket(`ws://${location.host}/own-ws`);
    ws.onopen = () => ws.send('hi');
    ws.onmessage = (event) => { ws.close(); resolve(event.data); };
    ws.onerror = () => resolve('refused');
  });
  done(out);
})().catch((error) => done({error: String(error)}));
"""
# Run on a page of another session (arguments[0] is the target's origin): what a hostile app's page would try.
SIBLING_PAGE_SCRIPT = """
const done = arguments[arguments.length - 1];
const target = arguments[0];
const out = {};
(async () => {
  try {
    await fetch(target + '/sibling-post', {method: 'POST', body: 'x', credentials: 'include', mode: 'no-cors'});
    out.post = 'sent';
  } catch (error) { out.post = 'network error'; }
  try { await fetch(target + '/sibling-get', {credentials: 'include', mode: 'no-cors'}); } catch (error) {}
  out.ws = await new Promise((resolve) => {
    const ws = new WebSocket(target.replace('http:', 'ws:') + '/sibling-ws');
    ws.onopen = () => { ws.close(); resolve('open'); };
    ws.onerror = () => resolve('refused');
  });
  done(out);
})().catch((error) => done({error: String(error)}));
"""


def page_json(browser: WebDriver) -> Any:
    return json.loads(browser.find_element(By.TAG_NAME, "body").text)


def test_a_page_of_one_session_reaches_no_other_session_in_chromium(
    api_and_proxy: tuple[Server, Proxy], browser: WebDriver, live_settings: Settings, slurm_account: str, tenant_b: str,
    app_dir: Path,
) -> None:
    """A tenant lures a customer of another account to its own session (links are bearer links): its page
    then tries the customer's session with the customer's own cookie, which the browser sends (same site)."""
    server, proxy = api_and_proxy
    victim_token = recorded_token(live_settings, slurm_account, sub=f"v-{secrets.token_hex(3)}")
    attacker_token = recorded_token(live_settings, tenant_b, sub=f"a-{secrets.token_hex(3)}")
    victim, attacker = start_sessions(server, app_dir, [victim_token, attacker_token])
    victim_origin, attacker_origin = (f"http://{proxy.host(label_of(session))}" for session in (victim, attacker))

    # The customer opens their session: the link's page, then the app, with the SameSite=Strict cookie.
    browser.get(fresh_link(server, victim_token, victim))
    wait_for(lambda: browser.current_url == victim_origin + "/", timeout_s=30, what="the session's app after its link")
    assert page_json(browser)["path"] == "/" and page_json(browser)["cookie"] is None
    browser.set_script_timeout(30)
    assert browser.execute_async_script(OWN_PAGE_SCRIPT) == {"post": "200 mine", "ws": "echo:hi"}

    # Lured to the tenant's session, whose app sets cookies for every session and in gpupool's names:
    # only its own origin's cookie stays (and the grant), nor did the WebSocket handshake's wider one.
    browser.get(fresh_link(server, attacker_token, attacker))
    wait_for(lambda: browser.current_url == attacker_origin + "/", timeout_s=30, what="the other session's app")
    browser.get(attacker_origin + "/toss")
    cookies = {(cookie["name"], cookie["domain"].lstrip(".")) for cookie in browser.get_cookies()}
    attacker_host = proxy.host(label_of(attacker)).split(":")[0]
    assert cookies == {("kept", attacker_host), (COOKIE_NAME, attacker_host)}, cookies

    # Its page writes to the customer's session and opens a WebSocket there: refused; the app heard of neither.
    attacked = browser.execute_async_script(SIBLING_PAGE_SCRIPT, victim_origin)
    assert attacked["ws"] == "refused", attacked
    browser.get(victim_origin + "/seen")
    seen = page_json(browser)
    assert "POST /own-post" in seen and "GET /own-ws" in seen and not [line for line in seen if "sibling" in line], seen
    answered = [line for line in (proxy.state_dir / "access.log").read_text().splitlines() if "/sibling-" in line]
    assert len(answered) == 3 and all('" 403 ' in line for line in answered), answered

    # A link on its page to the customer's session is refused too (same site), saying why.
    browser.get(attacker_origin + "/")
    browser.execute_script("location.href = arguments[0]", victim_origin + "/sibling-navigation")
    wait_for(lambda: browser.current_url == victim_origin + "/sibling-navigation", timeout_s=30, what="the navigation")
    assert page_json(browser)["error"] == "cross_origin"

    # Its script sets a grant cookie for the parent domain: the customer's next request carries two, and is refused.
    browser.get(attacker_origin + "/")
    browser.execute_script(f"document.cookie = '{COOKIE_NAME}=tossed; domain={proxy.domain}; path=/'")
    browser.get(victim_origin + "/")
    assert page_json(browser)["error"] == "duplicate_cookie"


def fresh_link(server: Server, token: str, session: dict) -> str:
    """A new single-use link to the session (each lives a minute)."""
    link = http("GET", f"{server.url}/jobs/{session['job_id']}/session", token=token).body["link"]
    assert isinstance(link, str), link
    return link


def start_sessions(server: Server, app_dir: Path, tokens: list[str]) -> list[dict]:
    """One webapp session per token, submitted together, each once ready."""
    job_ids = []
    for token in tokens:
        reply = http("POST", server.url + "/submit", token=token,
                     body={"template": "webapp", "gpus": 1, "params": {"command": f'exec python3 {app_dir / "app.py"}'}})
        assert reply.status == 201, reply.body
        job_ids.append(reply.body["job_id"])

    def ready(job_id: str, token: str) -> dict | None:
        session = http("GET", f"{server.url}/jobs/{job_id}/session", token=token).body
        assert session["state"] in ("starting", "ready"), session
        return session if session["state"] == "ready" else None

    try:
        return [
            wait_for(functools.partial(ready, job_id, token), timeout_s=180, interval_s=1, what="the session to be ready")
            for job_id, token in zip(job_ids, tokens, strict=True)
        ]
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{queue_report()}") from exc


def listening_ports(uid: int) -> list[int]:
    """The TCP ports with a listening socket of this uid, as the kernel lists them in /proc/net/tcp and tcp6."""
    ports = set()
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[7]) == uid:  # 0A: TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


PORT_PROBE = r"""
import json, socket, sys
hosts, ports = json.loads(sys.argv[1]), json.loads(sys.argv[2])
answers = {}
for host in hosts:
    for port in ports:
        try:
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.settimeout(10)
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Gpupool-Session-Secret: guessed\r\nConnection: close\r\n\r\n")
                first = sock.recv(200).decode("latin-1").split("\r\n", 1)[0]
        except ConnectionRefusedError:
            first = "refused"
        except OSError as exc:
            first = "error: " + str(exc)
        answers[host + ":" + str(port)] = first or "closed without an answer"
print(json.dumps(answers))
"""


def probe_ports(user: str, hosts: list[str], ports: list[int]) -> dict[str, str]:
    """Connect, as `user`, to each host:port and send a request with a guessed secret: the first line of each answer."""
    result = run_command(
        ["/usr/sbin/runuser", "-u", user, "--", "/usr/bin/python3", "-c", PORT_PROBE, json.dumps(hosts), json.dumps(ports)],
        timeout_s=120, env={"PATH": "/usr/bin:/bin"}, check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def session_port(server: Server, token: str, session: dict) -> int:
    """The port the shim listens on, as the API stored it (read through the database the server uses)."""
    engine = db.make_engine(server.env["GPUPOOL_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT port FROM job_sessions WHERE job_id = :j"), {"j": session["job_id"]}).scalar_one())
    finally:
        engine.dispose()


def operator(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GPUPOOL), *args], env=server.env, capture_output=True, text=True, timeout=120, check=False)


def gpu_index(server: Server, token: str, session: dict) -> int:
    """The GPU Slurm gave the 1-GPU session job, as ``scontrol --details`` prints it (GRES IDX)."""
    job = http("GET", f"{server.url}/jobs/{session['job_id']}", token=token).body
    text = slurm_cmd("scontrol", "--details", "show", "job", str(job["slurm_job_id"]))
    found = re.search(r"GRES=gpu:\w+:1\(IDX:(\d+)\)", text)
    assert found, text
    return int(found[1])


def test_a_session_with_no_request_but_a_busy_gpu_is_kept_while_one_at_0_percent_is_stopped(
    api_and_proxy: tuple[Server, Proxy], live_settings: Settings, slurm_account: str, app_dir: Path,
) -> None:
    """JupyterLab training with the browser closed: the node's exporter (recorded output, served here) says the GPU is busy."""
    server, _proxy = api_and_proxy
    token = recorded_token(live_settings, slurm_account, sub=f"g-{secrets.token_hex(3)}")
    # The busy one first: its minute without a request is up before the idle one's.
    busy = start_session(server, token, app_dir, idle_timeout_min=1)
    idle = start_session(server, token, app_dir, idle_timeout_min=1)
    served = {gpu_index(server, token, busy): 90.0, gpu_index(server, token, idle): 0.0}
    outputs: list[str] = []
    with serve_exporter(served) as exporter:
        env = {**server.env, "GPUPOOL_GPU_EXPORTER_URL": "http://127.0.0.1:{port}/metrics", "GPUPOOL_GPU_EXPORTER_PORT": str(exporter.port)}

        def check_and_sweep() -> bool:
            checked = subprocess.run([str(GPUPOOL), "idle", "check"], env=env, capture_output=True, text=True, timeout=120, check=False)
            assert checked.returncode == 0 and "GPU metrics not read" not in checked.stdout, (checked.stdout, checked.stderr)
            swept = subprocess.run([str(GPUPOOL), "sessions", "sweep"], env=env, capture_output=True, text=True, timeout=120, check=False)
            assert swept.returncode == 0, swept.stderr
            outputs.append(swept.stdout)
            return idle["job_id"] in swept.stdout

        wait_for(check_and_sweep, timeout_s=300, interval_s=10, what="the sweep to stop the session at 0 %")
        check_and_sweep()  # and once more, past both timeouts
        assert exporter.scrapes >= 2
    assert not any(busy["job_id"] in output for output in outputs), outputs
    # No request for over its minute, as its own page says, and still running: in gpupool and in Slurm.
    kept = http("GET", f"{server.url}/jobs/{busy['job_id']}/session", token=token).body
    assert kept["state"] == "idle" and kept["idle_min"] >= 1, kept
    kept_job = http("GET", f"{server.url}/jobs/{busy['job_id']}", token=token).body
    assert kept_job["state"] == "RUNNING" and kept_job["end_reason"] is None, kept_job
    assert "JobState=RUNNING" in slurm_cmd("scontrol", "show", "job", str(kept_job["slurm_job_id"]))
    stopped = wait_for(
        lambda: (body := http("GET", f"{server.url}/jobs/{idle['job_id']}", token=token).body)["state"] not in ("RUNNING", "COMPLETING") and body,
        timeout_s=60, what="the idle session's job to end",
    )
    assert stopped["state"] == "CANCELLED", stopped
    assert stopped["end_reason"] == "idle: no request, no open WebSocket and no GPU at 5% or more for 1 min; gpupool cancelled it"


def test_idle_session_is_cancelled_and_billed_for_its_run(
    api_and_proxy: tuple[Server, Proxy], live_settings: Settings, slurm_account: str, app_dir: Path,
) -> None:
    server, proxy = api_and_proxy
    token = recorded_token(live_settings, slurm_account, sub=f"i-{secrets.token_hex(3)}")
    # The customer's command: submits, waits until the session is ready, prints its link.
    started = subprocess.run(
        [str(GPUPOOL_CLIENT), "--url", server.url, "--token", token, "session", "webapp", "--gpus", "1", "--idle-timeout", "1",
         "-p", f"command=exec python3 {app_dir / 'app.py'}", "--json", "--timeout", "180"],
        capture_output=True, text=True, timeout=240, check=False, env={"PATH": "/usr/bin:/bin"},
    )
    assert started.returncode == 0, f"{started.stderr}\n{queue_report()}"
    session = json.loads(started.stdout)
    assert session["state"] == "ready" and session["idle_timeout_min"] == 1, session
    assert session["link"].startswith(f"http://{label_of(session)}.{proxy.domain}:{proxy.port}/.gpupool/open?link=")
    job_id = session["job_id"]
    hook = http("POST", server.url + "/webhooks", token=token, body={"url": "http://127.0.0.1:9/hook", "events": ["job.ended"]})
    assert hook.status == 201, hook.body
    # The shim itself says nothing went through since it started, and no WebSocket is open.
    status = shim_status(node_address(http("GET", f"{server.url}/jobs/{job_id}", token=token).body["node"]),
                         session_port(server, token, session), "wrong-secret", 5)
    assert status is None  # the status needs the secret too

    def swept() -> bool:
        result = operator(server, "sessions", "sweep")
        assert result.returncode == 0, result.stderr
        return job_id in result.stdout

    wait_for(swept, timeout_s=240, interval_s=5, what="the idle sweep to cancel the session")
    ended = wait_for(
        lambda: (body := http("GET", f"{server.url}/jobs/{job_id}", token=token).body)["state"] not in ("RUNNING", "COMPLETING") and body,
        timeout_s=60, what="the job to end",
    )
    assert ended["state"] == "CANCELLED" and "idle" in ended["end_reason"], ended
    assert http("GET", f"{server.url}/jobs/{job_id}/session", token=token).body["state"] == "ended"
    # The job.ended webhook says why.
    deliveries = http("GET", f"{server.url}/webhooks/{hook.body['id']}/deliveries", token=token).body["deliveries"]
    ended_events = [d["payload"]["data"]["job"] for d in deliveries if d["event_type"] == "job.ended" and d["job_id"] == job_id]
    assert len(ended_events) == 1 and ended_events[0]["end_reason"] == ended["end_reason"], deliveries
    row = sacct_row(ended["slurm_job_id"], "JobID,State,ElapsedRaw,Start,End")
    assert row["State"].startswith("CANCELLED"), row

    # Billed exactly its run: the invoice's GPU-seconds are sacct's elapsed seconds x its 1 GPU.
    assert operator(server, "price", "set", "*", "0.00012", "--from", "2020-01-01").returncode == 0
    billed = operator(server, "billing", "run")
    assert billed.returncode == 0, billed.stderr
    period = row["Start"][:7]
    invoice = operator(server, "invoice", "--account", slurm_account, "--period", period, "-o", "-")
    assert invoice.returncode == 0, invoice.stderr
    lines = [line for line in csv.DictReader(io.StringIO(invoice.stdout)) if line["line_type"] == "job" and line["slurm_job_id"] == str(ended["slurm_job_id"])]
    assert lines, invoice.stdout
    assert sum(int(line["billed_seconds"]) for line in lines) == int(row["ElapsedRaw"])
    assert sum(int(line["gpu_seconds"]) for line in lines) == int(row["ElapsedRaw"])
    # The invoice says why the run ended: on the run's last line, gpupool's own reason.
    assert [line["end_reason"] for line in lines] == [""] * (len(lines) - 1) + [ended["end_reason"]], lines
