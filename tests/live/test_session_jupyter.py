"""JupyterLab from PyPI as a session, through gpupool's sign-in and nginx, in headless Chromium.

The virtualenv is made once under /var/tmp (where tenants can read it), as
production would use an image; the shipped `jupyter` template runs it with
its bin folder first on PATH and nothing else changed. In the browser: sign
in, open the session from the job page, and from JupyterLab's own page run
code in a new kernel over its WebSocket, which prints the job's SLURM_JOB_ID
and the GPUs Slurm gave it, and saves a file through JupyterLab's contents API:
JupyterLab opened in the account's storage ($GPUPOOL_DATA, a real volume), so
``/files`` serves the file and the Files page lists it. Then a page of another tenant's session, in the
same browser, tries JupyterLab's terminal API and a kernel's WebSocket with
the customer's own cookie (the shim's token makes jupyter_server skip its own
Origin and XSRF checks, so nginx's are the ones that hold).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

from bench.support.services import TENANT_PREFIX
from bench.support.storage import storage_helper
from gpupool.config import Settings
from gpupool.proc import run_command
from tests.conftest import REPO, recorded_token, wait_for
from tests.live import test_browser, test_sessions, test_storage
from tests.live.conftest import Server, http
from tests.live.test_browser import sign_in
from tests.live.test_sessions import Proxy

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
# Fixtures of the modules next door: headless Chromium, and the API with nginx in front.
browser = test_browser.browser
queue_of_its_own = test_sessions.queue_of_its_own
app_dir = test_sessions.app_dir
# The account volumes of the storage tests (both accounts'), served through a run-as helper that knows their root.
storage_root = test_storage.storage_root
storage_settings = test_storage.storage_settings
volumes = test_storage.volumes

JUPYTER_VENV = Path("/var/tmp/gpupool-test-jupyterlab")
# Runs in JupyterLab's page: a kernel, and one execute_request over the kernel's WebSocket.
RUN_CELL = """
const done = arguments[arguments.length - 1];
const code = arguments[0];
(async () => {
  const made = await fetch('/api/kernels', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'});
  if (!made.ok) { done('kernel: HTTP ' + made.status); return; }
  const kernel = await made.json();
  const socket = new WebSocket(`ws://${location.host}/api/kernels/${kernel.id}/channels`);
  const msgId = crypto.randomUUID();
  let output = '';
  socket.onopen = () => socket.send(JSON.stringify({
    header: {msg_id: msgId, username: 'test', session: crypto.randomUUID(), msg_type: 'execute_request', version: '5.3'},
    parent_header: {}, metadata: {}, channel: 'shell',
    content: {code: code, silent: false, store_history: false, user_expressions: {}, allow_stdin: false},
  }));
  socket.onmessage = (event) => {
    const message = JSON.parse(event.data);
    if (message.parent_header.msg_id !== msgId) return;
    if (message.msg_type === 'stream') output += message.content.text;
    if (message.msg_type === 'error') output += 'error: ' + message.content.ename;
    if (message.msg_type === 'status' && message.content.execution_state === 'idle' && output) { socket.close(); done(output); }
  };
  socket.onerror = () => done('websocket error');
})().catch((error) => done('error: ' + error));
"""
CELL = "import os; print(os.environ['SLURM_JOB_ID'], os.environ.get('SLURM_GPUS_ON_NODE'), os.getcwd())"
# Saved from JupyterLab's page as its editor saves a file: PUT /api/contents/<path>, relative to its root folder.
SAVED_NAME = "saved-in-jupyterlab.txt"
SAVE_FILE = """
const done = arguments[arguments.length - 1];
fetch('/api/contents/' + arguments[0], {method: 'PUT', headers: {'Content-Type': 'application/json'},
  body: JSON.stringify({type: 'file', format: 'text', content: arguments[1]})})
  .then((answer) => done(answer.status)).catch((error) => done('error: ' + error));
"""
# Run on JupyterLab's own page: its terminals, and (with arguments[0]) a new one.
TERMINALS = """
const done = arguments[arguments.length - 1];
(async () => {
  if (arguments[0]) {
    const made = await fetch('/api/terminals', {method: 'POST'});
    if (!made.ok) { done('terminal: HTTP ' + made.status); return; }
  }
  const listed = await fetch('/api/terminals');
  done((await listed.json()).map((terminal) => terminal.name));
})().catch((error) => done('error: ' + error));
"""
# Run on a page of another session: JupyterLab's terminal API and a kernel's WebSocket, with the browser's cookie.
FROM_A_SIBLING = """
const done = arguments[arguments.length - 1];
const [target, kernel] = [arguments[0], arguments[1]];
const out = {};
(async () => {
  try {
    await fetch(target + '/api/terminals', {method: 'POST', credentials: 'include', mode: 'no-cors'});
    out.post = 'sent';
  } catch (error) { out.post = 'network error'; }
  out.ws = await new Promise((resolve) => {
    const socket = new WebSocket(target.replace('http:', 'ws:') + '/api/kernels/' + kernel + '/channels');
    socket.onopen = () => { socket.close(); resolve('open'); };
    socket.onerror = () => resolve('refused');
  });
  done(out);
})().catch((error) => done({error: String(error)}));
"""


@pytest.fixture(scope="module")
def jupyter_venv() -> Path:
    """JupyterLab from PyPI in a virtualenv the tenants can run (made once: about 2.5 minutes)."""
    if not (JUPYTER_VENV / "bin" / "jupyter-lab").exists():
        shutil.rmtree(JUPYTER_VENV, ignore_errors=True)
        run_command(["/usr/bin/python3", "-m", "venv", str(JUPYTER_VENV)], timeout_s=300, env={"PATH": "/usr/bin:/bin"})
        run_command(
            [str(JUPYTER_VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "jupyterlab"],
            timeout_s=1200, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
        )
    return JUPYTER_VENV


@pytest.fixture(scope="module")
def session_templates_dir(jupyter_venv: Path) -> Iterator[str]:
    """The shipped templates; `jupyter` with the test's virtualenv first on PATH, its body otherwise as shipped."""
    root = Path(tempfile.mkdtemp(prefix="gpupool-templates-", dir="/var/tmp"))
    root.chmod(0o755)
    for shipped in (REPO / "slurm_templates").iterdir():
        shutil.copytree(shipped, root / shipped.name)
    body = root / "jupyter" / "run.sh"
    body.write_text(f'export PATH="{jupyter_venv}/bin:$PATH"\n' + body.read_text())
    yield str(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def storage_socket(job_root: Path, storage_root: Path, volumes: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with storage_helper(job_root, storage_root, tmp_path_factory.mktemp("jupyter-runas")) as socket_path:
        yield socket_path


@pytest.fixture
def api_and_proxy(
    start_server: Callable[..., Server], session_templates_dir: str, storage_socket: str, storage_root: Path,
) -> Iterator[tuple[Server, Proxy]]:
    """The API with sessions and account storage on (as a site with both runs), nginx in front."""
    with test_sessions.serving_sessions(
        start_server, templates_dir=session_templates_dir, runas_socket=storage_socket, storage_root=str(storage_root),
    ) as both:
        yield both


def jupyter_ports(job_dir: Path) -> set[int]:
    """The ports JupyterLab says it serves on (its runtime files, in the job's HOME: the job's folder)."""
    runtime = job_dir / ".local" / "share" / "jupyter" / "runtime"
    return {json.loads(path.read_text())["port"] for path in runtime.glob("jpserver-*.json")}


def test_jupyterlab_through_the_proxy_in_chromium(
    api_and_proxy: tuple[Server, Proxy], browser: WebDriver, live_settings: Settings, slurm_account: str, tenant_b: str,
    app_dir: Path, storage_root: Path,
) -> None:
    server, proxy = api_and_proxy
    token = recorded_token(live_settings, slurm_account, sub=f"j-{secrets.token_hex(3)}")
    submitted = http("POST", server.url + "/submit", token=token, body={"template": "jupyter", "gpus": 1})
    assert submitted.status == 201, submitted.body
    job_id = submitted.body["job_id"]
    # Another account's web app, started meanwhile: its page is the hostile one below.
    other_token = recorded_token(live_settings, tenant_b, sub=f"o-{secrets.token_hex(3)}")
    [other] = test_sessions.start_sessions(server, app_dir, [other_token])
    wait_for(
        lambda: http("GET", f"{server.url}/jobs/{job_id}/session", token=token).body["state"] == "ready",
        timeout_s=300, interval_s=2, what="JupyterLab to be ready",
    )
    job = http("GET", f"{server.url}/jobs/{job_id}", token=token).body

    # Sign in, open the session from the job page: a new tab on the session's own origin.
    sign_in(browser, server, token)
    browser.get(f"{server.url}/ui/jobs/{job_id}")
    assert browser.find_element(By.ID, "session-state").text == "ready"
    browser.find_element(By.ID, "session-open").click()
    wait_for(lambda: len(browser.window_handles) == 2, timeout_s=30, what="the session's tab")
    browser.switch_to.window(browser.window_handles[1])
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#jp-main-dock-panel, .jp-LabShell"), timeout_s=120,
             what="JupyterLab's page")
    assert browser.current_url.startswith("http://") and f".{proxy.domain}:{proxy.port}/" in browser.current_url
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".jp-Launcher"), timeout_s=120, what="the launcher")
    # Every script, stylesheet and API call of JupyterLab came through: nothing failed to load.
    refused = [line for line in (proxy.state_dir / "access.log").read_text().splitlines() if '" 200 ' not in line and '" 204 ' not in line and '" 101 ' not in line and '" 303 ' not in line]
    errors = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors and not browser.find_elements(By.CSS_SELECTOR, ".jp-Dialog"), (errors, refused)
    if os.environ.get("GPUPOOL_DOCS_SCREENSHOTS") == "1":
        browser.save_screenshot(str(REPO / "docs" / "jupyterlab-session.png"))

    # A kernel of this JupyterLab, asked over its WebSocket from the page itself, runs in the Slurm job.
    browser.set_script_timeout(120)
    printed = browser.execute_async_script(RUN_CELL, CELL)
    # The job's id and the one GPU Slurm gave it (the emulated GPUs set no CUDA_VISIBLE_DEVICES), in the account's storage.
    assert printed.split() == [str(job["slurm_job_id"]), "1", str(storage_root / slurm_account)], printed
    # A file saved in JupyterLab is in the account's storage: /files serves it (and the Files page lists it).
    assert browser.execute_async_script(SAVE_FILE, SAVED_NAME, f"saved in job {job_id}\n") == 201
    saved = http("GET", f"{server.url}/files/{SAVED_NAME}", token=token)
    assert (saved.status, saved.body) == (200, f"saved in job {job_id}\n"), (saved.status, saved.body)

    # A page of another tenant's session, in this browser (lured there by its bearer link), posts to this
    # JupyterLab's terminal API and opens a kernel's WebSocket: the browser sends the customer's cookie
    # (same site), nginx refuses both, and no terminal exists; from JupyterLab's own page the same POST works.
    jupyter_origin = browser.execute_script("return location.origin")
    [kernel] = browser.execute_async_script("const done = arguments[0]; fetch('/api/kernels').then((r) => r.json())"
                                            ".then((kernels) => done(kernels.map((k) => k.id)))")
    assert browser.execute_async_script(TERMINALS, False) == []
    browser.get(test_sessions.fresh_link(server, other_token, other))
    other_origin = f"http://{proxy.host(test_sessions.label_of(other))}"
    wait_for(lambda: browser.current_url == other_origin + "/", timeout_s=30, what="the other session's app")
    attacked = browser.execute_async_script(FROM_A_SIBLING, jupyter_origin, kernel)
    assert attacked["ws"] == "refused", attacked
    browser.get(jupyter_origin + "/lab")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".jp-LabShell"), timeout_s=120, what="JupyterLab again")
    assert browser.execute_async_script(TERMINALS, False) == []
    # nginx's answers: the sibling's POST 403; of the kernel's two WebSockets, JupyterLab's own 101, the sibling's 403.
    log = (proxy.state_dir / "access.log").read_text().splitlines()
    posts = [line.split('" ')[1].split()[0] for line in log if "POST /api/terminals" in line]
    sockets = sorted(line.split('" ')[1].split()[0] for line in log if f"/api/kernels/{kernel}/channels" in line)
    assert (posts, sockets) == (["403"], ["101", "403"]), (posts, sockets)
    assert len(browser.execute_async_script(TERMINALS, True)) == 1

    # JupyterLab's own port is on the loopback of the job's private network namespace: another tenant
    # on the node, trying it on the node's 127.0.0.1, finds nothing there (and JupyterLab wants its token too).
    app_ports = jupyter_ports(Path(server.env["GPUPOOL_JOB_ROOT"]) / slurm_account / job_id)
    assert app_ports, "JupyterLab wrote no runtime file"
    for port in app_ports:
        probe = subprocess.run(
            ["/usr/sbin/runuser", "-u", TENANT_PREFIX + tenant_b, "--", "/usr/bin/python3", "-c",
             "import socket\n"
             f"try: socket.create_connection(('127.0.0.1', {port}), timeout=10).close(); print('connected')\n"
             "except ConnectionRefusedError: print('refused')\n"],
            capture_output=True, text=True, timeout=30, check=False, env={"PATH": "/usr/bin:/bin"},
        )
        assert probe.stdout.strip() == "refused", (port, probe.stdout, probe.stderr)

    # The file saved in JupyterLab, on gpupool's own Files page (its origin: the customer's sign-in still holds).
    browser.switch_to.window(browser.window_handles[0])
    browser.get(f"{server.url}/ui/files/")
    assert browser.find_elements(By.CSS_SELECTOR, f'#files tr[data-name="{SAVED_NAME}"]')
