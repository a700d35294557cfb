"""On a fresh minimal Debian 12 host, the README's `make run` reaches a token and its curl submit works.

The host (deploy/freshhost) is a debootstrap `minbase` Debian 12 with systemd
as PID 1 and only git, make and curl added, as in the issue: no Python, no
python3-apt, no sudo. The checkout goes to /opt/gpupool (what a clone has),
and root runs the README's first command there from a root login's
environment, XDG_RUNTIME_DIR included. Then the README's curl submit, the job
followed to its end with GET /jobs/<id>, and its log fetched.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.freshhost.conftest import REPO, FreshHost, checkout_files
from tests.support.readme import readme_first_command, readme_submit

pytestmark = [pytest.mark.freshhost]

CLONE = "/opt/gpupool"
# A first run installs Python, the virtualenv and Slurm from the registries.
TOKEN_WAIT_S = 1500
JOB_WAIT_S = 300


def copy_checkout(host: FreshHost) -> None:
    target = host.root / CLONE.lstrip("/")
    target.mkdir(parents=True)
    names = "\0".join(checkout_files()).encode()
    pack = subprocess.Popen(["tar", "-C", str(REPO), "--null", "-T", "-", "-c"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    unpack = subprocess.Popen(["tar", "-x", "-C", str(target)], stdin=pack.stdout)
    assert pack.stdin is not None and pack.stdout is not None
    pack.stdin.write(names)
    pack.stdin.close()
    pack.stdout.close()
    assert pack.wait(timeout=120) == 0 and unpack.wait(timeout=120) == 0


def wait_for_token(make_run: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + TOKEN_WAIT_S
    while time.monotonic() < deadline:
        found = re.search(r"^\s*export TOKEN=(\S+)$", log.read_text(errors="replace"), re.MULTILINE)
        if found:
            return found.group(1)
        if make_run.poll() is not None:
            raise AssertionError(f"make run exited {make_run.returncode} before printing a token:\n{log.read_text()[-6000:]}")
        time.sleep(2)
    raise AssertionError(f"no token after {TOKEN_WAIT_S} s:\n{log.read_text()[-6000:]}")


def api(host: FreshHost, token: str, path: str) -> tuple[int, str]:
    result = host.run(f"export TOKEN={token}; curl -s -w '\\n%{{http_code}}' http://127.0.0.1:5000{path} "
                      '-H "Authorization: Bearer $TOKEN"')
    body, _, code = result.stdout.rpartition("\n")
    return int(code), body


def test_readme_make_run_then_curl_submit_on_fresh_debian_12(fresh_host: FreshHost, tmp_path: Path) -> None:
    first_command = readme_first_command()
    assert first_command == "make run"
    # What the user had: no Python at all.
    assert fresh_host.run("command -v python3 || echo none").stdout.strip() == "none"
    copy_checkout(fresh_host)

    log = tmp_path / "make-run.log"
    started = time.monotonic()
    make_run = fresh_host.popen(f"cd {CLONE} && {first_command}", log)
    try:
        token = wait_for_token(make_run, log)
        print(f"make run printed a token after {time.monotonic() - started:.0f} s")
        # gunicorn answers a moment after the banner.
        for _ in range(60):
            if fresh_host.run("curl -sf http://127.0.0.1:5000/healthz", check=False).returncode == 0:
                break
            time.sleep(1)

        submit = fresh_host.run(f"export TOKEN={token}; {readme_submit()}")
        job = json.loads(submit.stdout)
        job_id = job["job_id"]

        state = ""
        deadline = time.monotonic() + JOB_WAIT_S
        while time.monotonic() < deadline:
            code, body = api(fresh_host, token, f"/jobs/{job_id}")
            assert code == 200, body
            state = json.loads(body)["state"]
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUBMITTED"):
                break
            time.sleep(2)
        assert state == "COMPLETED", body

        code, logs = api(fresh_host, token, f"/jobs/{job_id}/logs")
        assert code == 200, logs
        assert "hi from gpupool" in logs, logs

        # The service's environment is its own: gunicorn never saw root's XDG_RUNTIME_DIR
        # (/run/user/0, mode 0700), so its control socket went under the service's HOME.
        text = log.read_text(errors="replace")
        assert "/run/user/0" not in text and "Control server error" not in text, text[-4000:]
        assert f"Control socket listening at {CLONE}/var/.gunicorn/gunicorn.ctl" in text, text[-4000:]
        print(f"job {job_id} {state} after {time.monotonic() - started:.0f} s; its log served")
    finally:
        make_run.terminate()
        try:
            make_run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            make_run.kill()
        print(log.read_text(errors="replace")[-3000:])
