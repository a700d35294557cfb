"""The playbook's gpupool_proxy role: renders nginx's sessions config, which nginx accepts, and converges.

The role runs on this machine from a playbook of the test's own (connection
local, nothing installed, the file written under a temporary folder), twice:
the second run changes nothing. Needs ansible-playbook in the virtualenv and
nginx (make venv-test installs nginx-light), not the cluster.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.support.processes import NGINX
from gpupool.proxy import JS, ProxyConfig, standalone_nginx_conf
from tests.cluster.ansible_run import RECAP_LINE, ansible_env, venv_tool

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "deploy" / "ansible"
KEY = "role-test-key-" + "r" * 30

PLAYBOOK = """---
- name: The sessions' proxy, alone
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
    gpupool_proxy_enabled: true
    gpupool_proxy_install_nginx: false
    gpupool_proxy_conf: {conf}
    gpupool_proxy_conf_group: root
    gpupool_proxy_key: {key}
    gpupool_proxy_sessions_domain: {domain}
    gpupool_proxy_js: {js}
    gpupool_proxy_auth_cache_dir: {cache}
    gpupool_proxy_listen: ["127.0.0.1:{port}"]
    gpupool_proxy_api_url: http://127.0.0.1:8000
    gpupool_proxy_public_api_url: https://gpupool.example.com
  tasks:
    - name: Put nginx in front of the interactive sessions
      ansible.builtin.import_role:
        name: gpupool_proxy
      when: gpupool_proxy_enabled | bool
"""


def write_playbook(tmp_path: Path, *, key: str = KEY, domain: str = "sessions.example.net") -> Path:
    playbook = tmp_path / "proxy.yml"
    playbook.write_text(PLAYBOOK.format(
        conf=tmp_path / "conf.d" / "gpupool-sessions.conf", key=key, port=18443, domain=domain,
        js=tmp_path / "gpupool-sessions.js", cache=tmp_path / "state" / "auth-cache",
    ))
    return playbook


def apply(playbook: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv_tool("ansible-playbook")), "-i", "localhost,", str(playbook)],
        cwd=ANSIBLE_DIR, env=ansible_env(ANSIBLE_DIR), capture_output=True, text=True, timeout=300, check=False,
    )


def run(playbook: Path) -> tuple[int, str]:
    completed = apply(playbook)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    recap = [match for match in RECAP_LINE.finditer(output) if match["host"] == "localhost"]
    assert recap and recap[-1]["failed"] == "0", output
    return int(recap[-1]["changed"]), output


def test_the_role_renders_a_config_nginx_accepts_and_converges(tmp_path: Path) -> None:
    conf = tmp_path / "conf.d" / "gpupool-sessions.conf"
    conf.parent.mkdir()
    playbook = write_playbook(tmp_path)
    first, output = run(playbook)
    assert first == 2, output
    assert conf.stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "gpupool-sessions.js").read_text() == JS.read_text()
    # The role's file is the one `gpupool proxy nginx-config` prints for the same values.
    config = ProxyConfig(
        sessions_domain="sessions.example.net", api_url="http://127.0.0.1:8000",
        public_api_url="https://gpupool.example.com", proxy_key=KEY, listen=("127.0.0.1:18443",),
        js_path=str(tmp_path / "gpupool-sessions.js"),
    )
    whole = standalone_nginx_conf(config, tmp_path / "state")
    assert conf.read_text() in whole
    second, output = run(playbook)
    assert second == 0, output
    if not Path(NGINX).exists():
        pytest.fail("nginx is missing: make venv-test installs nginx-light")
    (tmp_path / "nginx.conf").write_text(whole)
    checked = subprocess.run(
        [NGINX, "-t", "-p", str(tmp_path / "state"), "-c", str(tmp_path / "nginx.conf")],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert checked.returncode == 0, checked.stderr


def test_the_role_refuses_a_missing_key(tmp_path: Path) -> None:
    completed = apply(write_playbook(tmp_path, key='""'))
    assert completed.returncode != 0
    assert "Set gpupool_proxy_key" in completed.stdout
    assert not (tmp_path / "conf.d").exists()


def test_the_role_refuses_sessions_on_the_apis_site(tmp_path: Path) -> None:
    """sessions.example.com beside gpupool.example.com: a session's script could set cookies for example.com."""
    completed = apply(write_playbook(tmp_path, domain="sessions.example.com"))
    assert completed.returncode != 0
    assert "is the same site (example.com) as the API's host 'gpupool.example.com'" in completed.stdout, completed.stdout
    assert "a registrable domain of their own" in completed.stdout
    assert not (tmp_path / "conf.d").exists()
