"""The GPU-node, API and monitoring roles render the right files for the example site.

deploy/ansible/tests/render.yml runs the roles' configuration tasks for
inventories/example (a controller/API host, gpu01 with 4 RTX 4090, gpu02 with
2 RTX 3090) on this machine, from fake host facts and nvidia-smi output
recorded in deploy/ansible/tests/fixtures, writing every file under a
temporary folder. Needs ansible-playbook in the virtualenv and root (the
files are owned by root), not the cluster.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy
import yaml

from bench.support.http import free_port
from bench.support.processes import NGINX
from bench.support.services import wait_for
from gpupool.db import normalize_url
from gpupool.render import DOCKER_JOB_LABEL
from tests.cluster.ansible_run import RENDER_PLAYBOOK, PlaybookRun, ansible_env, render_env, run_playbook, venv_tool

pytestmark = [
    pytest.mark.ansible,
    pytest.mark.skipif(os.geteuid() != 0, reason="the rendered files are owned by root"),
]

# What gpu01 had before Docker's NVIDIA runtime was added: none of it may be lost.
EXISTING_DAEMON_JSON = {
    "log-driver": "json-file",
    "log-opts": {"max-size": "100m", "max-file": "3"},
    "registry-mirrors": ["https://mirror.example.net"],
    "runtimes": {"runsc": {"path": "/usr/local/bin/runsc"}},
}


class Rendered:
    def __init__(self, root: Path, munge_key: bytes, first: PlaybookRun, second: PlaybookRun) -> None:
        self.root = root
        self.munge_key = munge_key
        self.first = first
        self.second = second

    def path(self, host: str, relative: str) -> Path:
        return self.root / host / relative

    def text(self, host: str, relative: str) -> str:
        return self.path(host, relative).read_text()


def render_arguments(ansible_dir: Path, out: Path, *extra: str) -> list[str]:
    controller_key = out / "ctl1" / "etc" / "munge" / "munge.key"
    if not controller_key.exists():
        controller_key.parent.mkdir(parents=True)
        controller_key.write_bytes(os.urandom(1024))
    return ["-e", f"render_dir={out}", "-e", f"render_fixtures={ansible_dir / 'tests' / 'fixtures'}", *extra]


# The Slurm files (slurm.conf, gres.conf, cgroup.conf, the job hooks) and the boot and
# driver decisions they depend on, in a quarter of a full render's time: a test that
# checks only these renders only these (tests/render.yml's tags).
SLURM_FILES = ("--tags", "driver,slurm")


def render(ansible_dir: Path, out: Path, *extra: str) -> PlaybookRun:
    return run_playbook(ansible_dir, "example", RENDER_PLAYBOOK, *render_arguments(ansible_dir, out, *extra))


def render_refused(ansible_dir: Path, out: Path, *extra: str) -> str:
    """Render expecting some host to fail; returns the output."""
    completed = subprocess.run(
        [str(venv_tool("ansible-playbook")), "-i", str(ansible_dir / "inventories" / "example"), RENDER_PLAYBOOK,
         *render_arguments(ansible_dir, out, *extra)],
        cwd=ansible_dir,
        env=render_env(ansible_dir),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode != 0, completed.stdout
    return completed.stdout + completed.stderr


def boot_like(out: Path, host: str, *, cgroup_v2_only: bool, cmdline: str = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro") -> None:
    """What the host's kernel would show: the cgroup hierarchy and the command line it booted with."""
    controllers = out / host / "sys" / "fs" / "cgroup" / "cgroup.controllers"
    controllers.parent.mkdir(parents=True, exist_ok=True)
    if cgroup_v2_only:
        controllers.write_text("cpuset cpu io memory pids\n")
    (out / host / "proc").mkdir(parents=True, exist_ok=True)
    (out / host / "proc" / "cmdline").write_text(cmdline + "\n")


def with_apparmor_userns_restriction(out: Path, host: str) -> None:
    """Ubuntu 24.04's kernel switch and AppArmor 4's policy language."""
    switch = out / host / "proc" / "sys" / "kernel" / "apparmor_restrict_unprivileged_userns"
    switch.parent.mkdir(parents=True, exist_ok=True)
    switch.write_text("1\n")
    abi = out / host / "etc" / "apparmor.d" / "abi" / "4.0"
    abi.parent.mkdir(parents=True, exist_ok=True)
    abi.write_text("abi 4.0\n")


LETSENCRYPT = "etc/letsencrypt/live/gpupool.example.com"


def with_certificate(out: Path) -> None:
    """certbot has run on the API host (the files' contents do not matter to nginx's configuration)."""
    live = out / "ctl1" / LETSENCRYPT
    live.mkdir(parents=True, exist_ok=True)
    (live / "fullchain.pem").write_text("certificate\n")
    (live / "privkey.pem").write_text("key\n")


def summary(out: Path, host: str) -> dict[str, object]:
    return json.loads((out / f"{host}-summary.json").read_text())


# Tests of these share their renders of the example site (two each, about 25 s of CPU each), on one
# xdist worker; the rest render what they check for themselves and may run on either (tests/conftest.py).
XDIST_SHARED_FIXTURES = ("rendered", "rendered_noble")

@pytest.fixture(scope="module")
def rendered(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rendered]:
    ansible_dir = repo_root / "deploy" / "ansible"
    out = tmp_path_factory.mktemp("render")
    daemon_json = out / "gpu01" / "etc" / "docker" / "daemon.json"
    daemon_json.parent.mkdir(parents=True)
    daemon_json.write_text(json.dumps(EXISTING_DAEMON_JSON, indent=4))
    # Binary, as munge keys are; gpu02 starts with the key its own munge package made.
    munge_key = os.urandom(1024)
    for host, key in (("ctl1", munge_key), ("gpu02", os.urandom(1024))):
        key_file = out / host / "etc" / "munge" / "munge.key"
        key_file.parent.mkdir(parents=True)
        key_file.write_bytes(key)
        key_file.chmod(0o400)
    # Ubuntu 22.04 hosts with Slurm 21.08, booted with cgroup v2 only, the certificate in place.
    for host in ("gpu01", "gpu02"):
        boot_like(out, host, cgroup_v2_only=True)
    with_certificate(out)
    first = render(ansible_dir, out)
    second = render(ansible_dir, out)
    yield Rendered(out, munge_key, first, second)


@pytest.fixture(scope="module")
def rendered_noble(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rendered]:
    """Ubuntu 24.04 (Slurm 23.11): Secure Boot on, no certificate yet, AppArmor restricting user namespaces."""
    ansible_dir = repo_root / "deploy" / "ansible"
    out = tmp_path_factory.mktemp("render-noble")
    for host in ("gpu01", "gpu02"):
        boot_like(out, host, cgroup_v2_only=True)
        with_apparmor_userns_restriction(out, host)
    # An earlier release of the playbook turned the restriction off host-wide here.
    legacy = out / "gpu01" / "etc" / "sysctl.d" / "90-enroot-userns.conf"
    legacy.parent.mkdir(parents=True)
    legacy.write_text("kernel.apparmor_restrict_unprivileged_userns = 0\n")
    first = render(ansible_dir, out, "-e", "render_release=noble", "-e", "render_secure_boot=true")
    second = render(ansible_dir, out, "-e", "render_release=noble", "-e", "render_secure_boot=true")
    yield Rendered(out, b"", first, second)


def config_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def unit_settings(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd unit as section -> key -> values (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in config_lines(text):
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_every_host_gets_the_controllers_munge_key_readable_by_munge_only(rendered: Rendered) -> None:
    munge_uid = pwd.getpwnam("munge").pw_uid
    for host in ("gpu01", "gpu02"):
        key_file = rendered.path(host, "etc/munge/munge.key")
        assert key_file.read_bytes() == rendered.munge_key, host
        info = key_file.stat()
        assert stat.S_IMODE(info.st_mode) == 0o400 and info.st_uid == munge_uid, host
    # The key crosses as base64 and must not show up in Ansible's output.
    assert base64.b64encode(rendered.munge_key)[:32].decode() not in rendered.first.output


def test_gres_conf_lists_each_discovered_gpu_with_its_device_and_cores(rendered: Rendered) -> None:
    assert config_lines(rendered.text("gpu01", "etc/slurm/gres.conf")) == [
        "NodeName=gpu01 Name=gpu Type=rtx4090 File=/dev/nvidia0 Cores=0-15",
        "NodeName=gpu01 Name=gpu Type=rtx4090 File=/dev/nvidia1 Cores=0-15",
        "NodeName=gpu01 Name=gpu Type=rtx4090 File=/dev/nvidia2 Cores=16-31",
        "NodeName=gpu01 Name=gpu Type=rtx4090 File=/dev/nvidia3 Cores=16-31",
    ]
    # No topology recorded for gpu02: no Cores= at all, rather than a guess.
    assert config_lines(rendered.text("gpu02", "etc/slurm/gres.conf")) == [
        "NodeName=gpu02 Name=gpu Type=rtx3090 File=/dev/nvidia0",
        "NodeName=gpu02 Name=gpu Type=rtx3090 File=/dev/nvidia1",
    ]


def test_slurm_conf_has_a_node_line_per_compute_host_with_its_gpus(rendered: Rendered) -> None:
    nodes = [line for line in config_lines(rendered.text("ctl1", "etc/slurm/slurm.conf")) if line.startswith("NodeName=")]
    assert nodes == [
        "NodeName=gpu01 NodeAddr=10.0.0.21 CPUs=64 Sockets=2 CoresPerSocket=16 ThreadsPerCore=2 RealMemory=231300 Gres=gpu:rtx4090:4 State=UNKNOWN",
        "NodeName=gpu02 NodeAddr=10.0.0.22 CPUs=24 Sockets=1 CoresPerSocket=12 ThreadsPerCore=2 RealMemory=115200 Gres=gpu:rtx3090:2 State=UNKNOWN",
    ]


def test_every_host_gets_the_same_slurm_conf(rendered: Rendered) -> None:
    controller = rendered.text("ctl1", "etc/slurm/slurm.conf")
    assert rendered.text("gpu01", "etc/slurm/slurm.conf") == controller
    assert rendered.text("gpu02", "etc/slurm/slurm.conf") == controller
    # Addresses from the inventory: Slurm does not depend on the hosts resolving each other's names.
    assert "SlurmctldHost=ctl1(10.0.0.10)" in config_lines(controller)
    assert "AccountingStorageHost=10.0.0.10" in config_lines(controller)


def test_accounting_tracks_every_gpu_type_found_and_is_enforced(rendered: Rendered) -> None:
    settings = dict(line.split("=", 1) for line in config_lines(rendered.text("ctl1", "etc/slurm/slurm.conf")) if "=" in line)
    assert settings["AccountingStorageTRES"].split(",") == ["gres/gpu", "gres/gpu:rtx4090", "gres/gpu:rtx3090"]
    assert settings["AccountingStorageEnforce"] == "associations,limits,qos,safe"
    assert settings["AccountingStorageType"] == "accounting_storage/slurmdbd"


def test_slurm_itself_bounds_tenants_jobs_time_partition_and_per_gpu_caps(rendered: Rendered) -> None:
    lines = config_lines(rendered.text("ctl1", "etc/slurm/slurm.conf"))
    settings = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith(("NodeName=", "PartitionName=")))
    assert settings["EnforcePartLimits"] == "ALL"
    assert settings["JobSubmitPlugins"] == "lua"
    # gpupool's max_array_tasks (default 1000) tasks: indices 0 to 999, below MaxArraySize.
    assert settings["MaxArraySize"] == "1001"
    assert [line for line in lines if line.startswith("PartitionName=")] == [
        "PartitionName=gpu Nodes=ALL Default=YES DefaultTime=60 MaxTime=10080 State=UP"
    ]
    # Only slurmctld reads job_submit.lua: on the controller alone.
    lua = rendered.text("ctl1", "etc/slurm/job_submit.lua")
    assert not rendered.path("gpu01", "etc/slurm/job_submit.lua").exists()
    # One GPU's share of each node: gpu01 64 CPUs, 231300 MB, 4 GPUs; gpu02 24 CPUs, 115200 MB, 2 GPUs;
    # memory in whole GB (56 GB = 57344 MB), as gpupool's max_mem_gb_per_gpu counts it.
    assert "local share_any = { cpus = 12, mem_mb = 57344 }" in lua
    assert '["rtx4090"] = { cpus = 16, mem_mb = 57344 },' in lua
    assert '["rtx3090"] = { cpus = 12, mem_mb = 57344 },' in lua
    assert "local max_time_min = 10080" in lua
    assert "local exempt_uids = { [0] = true, }" in lua
    assert 'local allowed_partitions = { ["gpu"] = true, }' in lua
    assert "local floor_mem_mb = 4096" in lua
    luac = shutil.which("luac5.1") or shutil.which("luac")
    if luac is not None:
        checked = subprocess.run([luac, "-p", "-"], input=lua, capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stderr


def test_spot_jobs_are_preempted_by_qos_requeued_and_signalled(rendered: Rendered) -> None:
    lines = config_lines(rendered.text("ctl1", "etc/slurm/slurm.conf"))
    settings = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith(("NodeName=", "PartitionName=")))
    assert (settings["PreemptType"], settings["PreemptMode"], settings["JobRequeue"]) == ("preempt/qos", "REQUEUE", "1")
    # The example site's Slurm release decides the option's spelling; either way the job's --signal is sent.
    assert settings.get("SlurmctldParameters") == "preempt_send_user_signal" or settings.get("PreemptParameters") == "send_user_signal"
    lua = rendered.text("ctl1", "etc/slurm/job_submit.lua")
    assert 'local allowed_qos = { ["normal"] = true, ["spot"] = true, }' in lua


def test_cgroups_confine_devices_cores_and_memory_on_gpu_nodes(rendered: Rendered) -> None:
    for host in ("gpu01", "gpu02"):
        assert set(config_lines(rendered.text(host, "etc/slurm/cgroup.conf"))) == {
            "ConstrainCores=yes",
            "ConstrainRAMSpace=yes",
            "ConstrainDevices=yes",
        }
    settings = config_lines(rendered.text("ctl1", "etc/slurm/slurm.conf"))
    assert "ProctrackType=proctrack/cgroup" in settings
    assert "TaskPlugin=task/cgroup,task/affinity" in settings


def test_nvidia_runtime_is_merged_into_an_existing_daemon_json(rendered: Rendered) -> None:
    merged = json.loads(rendered.text("gpu01", "etc/docker/daemon.json"))
    assert merged == {
        **EXISTING_DAEMON_JSON,
        "runtimes": {
            "runsc": {"path": "/usr/local/bin/runsc"},
            "nvidia": {"args": [], "path": "nvidia-container-runtime"},
        },
    }


def test_daemon_json_is_created_where_there_was_none(rendered: Rendered) -> None:
    created = json.loads(rendered.text("gpu02", "etc/docker/daemon.json"))
    assert created == {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}


def test_api_runs_under_gunicorn_as_the_service_user(rendered: Rendered) -> None:
    unit = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-api.service"))
    service = unit["Service"]
    assert service["User"] == ["gpupool"] and service["Group"] == ["gpupool"]
    assert service["ExecStart"] == [f"/opt/gpupool/venv/bin/gunicorn --config {rendered.path('ctl1', 'etc/gpupool/gunicorn.conf.py')}"]
    assert service["EnvironmentFile"] == [str(rendered.path("ctl1", "etc/gpupool/gpupool.env"))]
    # Wiped at every start by systemd, as multi-worker metrics need.
    assert service["RuntimeDirectory"] == ["gpupool-api"]
    assert "PROMETHEUS_MULTIPROC_DIR=/run/gpupool-api" in service["Environment"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_gunicorn_configuration_is_python_with_the_production_settings(rendered: Rendered) -> None:
    settings: dict[str, object] = {}
    exec(compile(rendered.text("ctl1", "etc/gpupool/gunicorn.conf.py"), "gunicorn.conf.py", "exec"), settings)
    assert settings["wsgi_app"] == "api:create_app()"
    assert settings["bind"] == ["127.0.0.1:8000"]
    assert settings["workers"] == 9  # 8 CPUs: 2 x 8 + 1, at most 9
    assert settings["timeout"] == 30 and settings["graceful_timeout"] == 30
    # Threads: a file transfer holds one for its length, which a sync worker's timeout would cut.
    assert settings["worker_class"] == "gthread" and settings["threads"] == 4
    assert settings["preload_app"] is False
    assert settings["control_socket_disable"] is True  # systemd signals it; its HOME has no room for a socket


def test_billing_runs_every_five_minutes_as_its_own_user(rendered: Rendered) -> None:
    service = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-billing.service"))["Service"]
    assert service["Type"] == ["oneshot"]
    # Not the API's user, which could otherwise read its environment and memory.
    assert service["User"] == ["gpupool-billing"] and service["Group"] == ["gpupool-billing"]
    assert service["SupplementaryGroups"] == ["gpupool"]
    assert service["WorkingDirectory"] == ["/var/lib/gpupool-billing"]
    assert service["ExecStart"] == ["/opt/gpupool/venv/bin/gpupool billing run"]
    # Settings from the shared file; billing's connection is a credential of its own.
    assert service["EnvironmentFile"] == [str(rendered.path("ctl1", "etc/gpupool/gpupool.env"))]
    assert service["LoadCredential"] == [
        f"billing_database_url:{rendered.path('ctl1', 'etc/gpupool/credentials/billing/billing_database_url')}",
    ]
    timer = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-billing.timer"))
    assert timer["Timer"]["OnCalendar"] == ["*:0/5"]
    assert timer["Timer"]["Persistent"] == ["true"]
    assert timer["Timer"]["Unit"] == ["gpupool-billing.service"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]
    assert not rendered.path("ctl1", "etc/cron.d/gpupool-billing").exists()


def test_no_unit_runs_as_root(rendered: Rendered) -> None:
    for unit in ("gpupool-api.service", "gpupool-billing.service", "gpupool-sessions-sweep.service", *WORKER_SERVICES):
        text = rendered.text("ctl1", f"etc/systemd/system/{unit}")
        assert not re.search(r"^(User|Group)=(root|0)\s*$", text, re.MULTILINE), unit
        assert unit_settings(text)["Service"]["NoNewPrivileges"] == ["yes"], unit


def test_idle_sweep_runs_every_minute_as_the_api_user_with_only_the_database(rendered: Rendered) -> None:
    service = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-sessions-sweep.service"))
    # The API's user: its group reaches the run-as helper (scancel as the tenant), its role reads the secrets.
    assert service["Service"]["User"] == service["Service"]["Group"] == ["gpupool"]
    assert service["Service"]["Type"] == ["oneshot"]
    assert service["Service"]["ExecStart"] == ["/opt/gpupool/venv/bin/gpupool sessions sweep"]
    assert service["Unit"]["Requires"] == ["gpupool-runas.service"]
    assert service["Service"]["ProtectProc"] == ["invisible"]
    assert service["Service"]["LoadCredential"] == [
        f"database_url:{rendered.path('ctl1', 'etc/gpupool/credentials/api/database_url')}",
    ]
    timer = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-sessions-sweep.timer"))
    assert timer["Timer"]["OnUnitActiveSec"] == ["60s"] and timer["Timer"]["OnBootSec"] == ["60s"]
    assert timer["Timer"]["Unit"] == ["gpupool-sessions-sweep.service"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]


def test_api_holds_the_sessions_proxy_key_as_a_credential_not_in_its_environment(rendered: Rendered) -> None:
    credentials = rendered.path("ctl1", "etc/gpupool/credentials")
    drop_in = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-api.service.d/sessions.conf"))
    assert drop_in["Service"]["LoadCredential"] == [f"session_proxy_key:{credentials / 'api' / 'session_proxy_key'}"]
    key_file = credentials / "api" / "session_proxy_key"
    assert key_file.read_text() == "render-proxy-key-not-for-use-0123456789"
    assert key_file.stat().st_uid == 0 and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    environment = rendered.text("ctl1", "etc/gpupool/gpupool.env")
    assert "render-proxy-key" not in environment and "SESSION_PROXY_KEY" not in environment


def test_runas_helper_is_root_with_only_the_capabilities_it_needs(rendered: Rendered) -> None:
    unit = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-runas.service"))
    service = unit["Service"]
    assert service["ExecStart"] == [
        "/opt/gpupool/venv/bin/gpupool runas serve --socket /run/gpupool-runas/runas.sock"
        " --allow-user gpupool-billing --allow-user gpupool-operator"
    ]
    assert service["User"] == ["root"] and service["Group"] == ["root"]
    # It reads the job root and the service user and group from the API's environment.
    assert service["EnvironmentFile"] == [str(rendered.path("ctl1", "etc/gpupool/gpupool.env"))]
    assert service["RuntimeDirectory"] == ["gpupool-runas"] and service["RuntimeDirectoryMode"] == ["0750"]
    assert service["CapabilityBoundingSet"][0].split() == [
        "CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_FOWNER", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_KILL",
    ]
    assert service["NoNewPrivileges"] == ["yes"]
    # The job root, and the accounts' storage, which it writes only as an account's user (its storage agent).
    assert service["ProtectSystem"] == ["strict"] and service["ReadWritePaths"] == ["/srv/gpupool/jobs /srv/gpupool/data"]
    assert service["ProtectHome"] == ["yes"] and service["PrivateTmp"] == ["yes"]
    # Its job folders are 0710 with no set-group-id bit (gpupool.slurm.tenants), so it may set none.
    assert service["RestrictSUIDSGID"] == ["yes"]
    assert unit["Unit"]["RequiresMountsFor"] == ["/srv/gpupool/jobs /srv/gpupool/data"]
    assert unit["Unit"]["After"][-1] == "gpupool-storage.service"
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_the_accounts_volumes_are_mounted_at_boot_and_their_files_stream_through_nginx(rendered: Rendered) -> None:
    storage = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-storage.service"))
    assert storage["Service"]["Type"] == ["oneshot"] and storage["Service"]["RemainAfterExit"] == ["yes"]
    assert storage["Service"]["ExecStart"] == [f"{rendered.path('ctl1', 'usr/local/sbin/gpupool')} storage mount"]
    assert storage["Unit"]["Before"][0].split() == ["nfs-server.service", "gpupool-runas.service", "gpupool-api.service"]
    assert not rendered.path("gpu01", "etc/systemd/system/gpupool-storage.service").exists()
    site = rendered.text("ctl1", "etc/nginx/sites-available/gpupool")
    # The API's /files and the Files page's /ui/data/files (its uploads), alike.
    files = site.split("location ~ ^/(ui/data/)?files/ {", 1)[1].split("}", 1)[0]
    for directive in ("client_max_body_size 0;", "proxy_request_buffering off;", "proxy_buffering off;", "proxy_read_timeout 300s;",
                      # Unbuffered, nginx moves a buffer per read: a page at a time made a download 0.2x of nginx's own.
                      "proxy_buffer_size 1m;", "client_body_buffer_size 1m;"):
        assert directive in files
    environment = rendered.text("ctl1", "etc/gpupool/gpupool.env")
    assert 'GPUPOOL_STORAGE_ROOT="/srv/gpupool/data"' in environment and 'GPUPOOL_STORAGE_DEFAULT_QUOTA="10G"' in environment
    assert 'GPUPOOL_DATABASE_PRE_PING="false"' in environment  # one database host: no failover to ping for


def test_api_needs_the_runas_helper_and_can_gain_no_privileges(rendered: Rendered) -> None:
    unit = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-api.service"))
    assert unit["Unit"]["Requires"] == ["gpupool-runas.service"]
    assert "gpupool-runas.service" in unit["Unit"]["After"][0].split()
    assert unit["Service"]["NoNewPrivileges"] == ["yes"]
    assert unit["Service"]["RestrictSUIDSGID"] == ["yes"]


RENDER_SECRETS = (
    "render-secret-not-for-use", "render-api-password", "render-billing-password", "render-migrate-password", "render-redis-password",
    "render-webhooks-password", "render-email-password",
)


def test_environment_file_is_private_and_has_the_settings(rendered: Rendered) -> None:
    env_file = rendered.path("ctl1", "etc/gpupool/gpupool.env")
    info = env_file.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 0
    env = dict(line.split("=", 1) for line in config_lines(env_file.read_text()))
    # Read by the API, billing and the run-as helper alike: settings, never a secret
    # (those are each unit's own credentials).
    assert not [secret for secret in RENDER_SECRETS if secret in env_file.read_text()]
    assert not {"GPUPOOL_JWT_SECRET", "GPUPOOL_DATABASE_URL", "GPUPOOL_RATELIMIT_STORAGE_URI"} & set(env)
    assert env["GPUPOOL_BILLING_ARCHIVE_DIR"] == '"/var/lib/gpupool-billing/archive"'
    assert env["GPUPOOL_SERVICE_USER"] == '"gpupool"' and env["GPUPOOL_SERVICE_GROUP"] == '"gpupool"'
    # The API and billing reach the run-as helper here; the setting Slurm's user once had is gone.
    assert env["GPUPOOL_RUNAS_SOCKET"] == '"/run/gpupool-runas/runas.sock"'
    assert "GPUPOOL_SLURM_USER" not in env
    assert env["GPUPOOL_CONTAINER_RUNTIME"] == '"pyxis"'


def test_billing_and_the_operator_connect_as_their_own_database_roles(rendered: Rendered) -> None:
    files = {name: rendered.path("ctl1", f"etc/gpupool/{name}.env") for name in ("billing", "operator")}
    for env_file in files.values():
        info = env_file.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 0
    assert dict(line.split("=", 1) for line in config_lines(files["billing"].read_text())) == {
        "GPUPOOL_BILLING_DATABASE_URL": '"postgresql://gpupool_billing:render-billing-password@127.0.0.1/gpupool"',
    }
    assert dict(line.split("=", 1) for line in config_lines(files["operator"].read_text())) == {
        "GPUPOOL_DATABASE_URL": '"postgresql://gpupool_migrate:render-migrate-password@127.0.0.1/gpupool"',
        "GPUPOOL_JWT_SECRET": '"render-secret-not-for-use"',
        "GPUPOOL_DATABASE_API_ROLE": '"gpupool_api"',
        "GPUPOOL_DATABASE_BILLING_ROLE": '"gpupool_billing"',
        "GPUPOOL_DATABASE_WEBHOOKS_ROLE": '"gpupool_webhooks"',
        "GPUPOOL_DATABASE_EMAIL_ROLE": '"gpupool_email"',
    }
    # The API's unit reads none of them.
    api = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-api.service"))["Service"]
    assert api["EnvironmentFile"] == [str(rendered.path("ctl1", "etc/gpupool/gpupool.env"))]


def test_api_and_billing_each_hold_only_their_own_credentials(rendered: Rendered) -> None:
    units = {
        name: unit_settings(rendered.text("ctl1", f"etc/systemd/system/gpupool-{name}.service"))["Service"]
        for name in ("api", "billing")
    }
    credentials = rendered.path("ctl1", "etc/gpupool/credentials")
    # systemd shows a unit's credentials to that unit's user alone; the users differ,
    # so neither can read the other's credentials, /proc/<pid>/environ or memory.
    assert units["api"]["User"] != units["billing"]["User"]
    assert units["api"]["ProtectProc"] == units["billing"]["ProtectProc"] == ["invisible"]
    loaded = {name: dict(line.split(":", 1) for line in unit["LoadCredential"]) for name, unit in units.items()}
    assert loaded == {
        "api": {name: str(credentials / "api" / name) for name in ("database_url", "jwt_secret", "ratelimit_storage_uri")},
        "billing": {"billing_database_url": str(credentials / "billing" / "billing_database_url")},
    }
    assert (credentials / "api" / "database_url").read_text() == "postgresql://gpupool_api:render-api-password@127.0.0.1/gpupool"
    assert (credentials / "api" / "jwt_secret").read_text() == "render-secret-not-for-use"
    assert (credentials / "billing" / "billing_database_url").read_text() == (
        "postgresql://gpupool_billing:render-billing-password@127.0.0.1/gpupool"
    )
    # At rest, root's alone: the folders 0700, the files 0600.
    for path in [credentials, *credentials.rglob("*")]:
        info = path.stat()
        assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) == (0o700 if path.is_dir() else 0o600), path
    # Nothing of billing's in what the API's unit reads, nothing of the API's in billing's.
    api_reads = [Path(file) for file in loaded["api"].values()] + [Path(file) for file in units["api"]["EnvironmentFile"]]
    billing_reads = [Path(file) for file in loaded["billing"].values()] + [Path(file) for file in units["billing"]["EnvironmentFile"]]
    assert not [file for file in api_reads if "render-billing-password" in file.read_text() or "render-migrate-password" in file.read_text()]
    assert not [
        file for file in billing_reads
        if any(secret in file.read_text() for secret in ("render-api-password", "render-secret-not-for-use", "render-redis-password"))
    ]


WORKER_SERVICES = ("gpupool-webhooks.service", "gpupool-idle-check.service", "gpupool-email.service")


def secrets_read(service: dict[str, list[str]]) -> set[str]:
    """The render's secrets in the files systemd hands the unit: its credentials and environment files."""
    files = [Path(line.split(":", 1)[1]) for line in service.get("LoadCredential", [])] + [Path(f) for f in service["EnvironmentFile"]]
    return {secret for secret in RENDER_SECRETS for file in files if secret in file.read_text()}


def test_webhook_sender_runs_always_as_its_own_user_with_only_its_database_role(rendered: Rendered) -> None:
    unit = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-webhooks.service"))
    service = unit["Service"]
    assert service["Type"] == ["simple"] and service["ExecStart"] == ["/opt/gpupool/venv/bin/gpupool webhooks run"]
    # It talks to hosts the customers chose: a user of its own, in no group of the service's
    # (no job log, no run-as helper), so no process of the API's user is open to it either.
    assert service["User"] == service["Group"] == ["gpupool-webhooks"]
    assert "SupplementaryGroups" not in service
    credentials = rendered.path("ctl1", "etc/gpupool/credentials")
    assert service["LoadCredential"] == [f"database_url:{credentials / 'webhooks' / 'database_url'}"]
    assert (credentials / "webhooks" / "database_url").read_text() == (
        "postgresql://gpupool_webhooks:render-webhooks-password@127.0.0.1/gpupool"
    )
    assert service["EnvironmentFile"] == [str(rendered.path("ctl1", "etc/gpupool/gpupool.env"))]
    assert secrets_read(service) == {"render-webhooks-password"}
    # The code folder is the service group's: only the virtualenv shows, read-only.
    assert service["TemporaryFileSystem"] == ["/opt/gpupool:ro"] and service["BindReadOnlyPaths"] == ["/opt/gpupool/venv"]
    # Always up, and time on SIGTERM to finish the attempts in hand (each within webhook_timeout_s, 10 s).
    assert service["Restart"] == ["always"] and service["RestartSec"] == ["10"]
    assert int(service["TimeoutStopSec"][0]) > 10
    assert service["ProtectSystem"] == ["strict"] and service["ProtectProc"] == ["invisible"]
    assert service["CapabilityBoundingSet"] == [""]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_idle_check_runs_every_minute_as_the_api_user_and_an_unread_exporter_does_not_fail_it(rendered: Rendered) -> None:
    service = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-idle-check.service"))
    # Like the sessions' sweep: the API's user reaches the run-as helper (scancel as the tenant),
    # and its role records the samples and queues job.idle.
    assert service["Service"]["User"] == service["Service"]["Group"] == ["gpupool"]
    assert service["Service"]["Type"] == ["oneshot"]
    assert service["Service"]["ExecStart"] == ["/opt/gpupool/venv/bin/gpupool idle check"]
    assert service["Unit"]["Requires"] == ["gpupool-runas.service"]
    assert service["Service"]["LoadCredential"] == [
        f"database_url:{rendered.path('ctl1', 'etc/gpupool/credentials/api/database_url')}",
    ]
    # Status 3 (gpupool_cli.idle_cmds): the pass ran, some node's exporter did not answer. Only that.
    assert service["Service"]["SuccessExitStatus"] == ["3"]
    assert secrets_read(service["Service"]) == {"render-api-password"}
    timer = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-idle-check.timer"))
    assert timer["Timer"]["OnCalendar"] == ["*:0/1"] and timer["Timer"]["Unit"] == ["gpupool-idle-check.service"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]


def test_email_sender_runs_every_minute_as_its_own_user_with_only_the_outbox(rendered: Rendered) -> None:
    service = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-email.service"))["Service"]
    assert service["Type"] == ["oneshot"] and service["ExecStart"] == ["/opt/gpupool/venv/bin/gpupool email send-due"]
    assert service["User"] == service["Group"] == ["gpupool-email"] and "SupplementaryGroups" not in service
    credentials = rendered.path("ctl1", "etc/gpupool/credentials")
    # The example sets no SMTP login: the email role's connection is its only credential.
    assert service["LoadCredential"] == [f"database_url:{credentials / 'email' / 'database_url'}"]
    assert "Environment" not in service and not (credentials / "email" / "smtp_password").exists()
    assert (credentials / "email" / "database_url").read_text() == "postgresql://gpupool_email:render-email-password@127.0.0.1/gpupool"
    assert secrets_read(service) == {"render-email-password"}
    assert service["TemporaryFileSystem"] == ["/opt/gpupool:ro"] and service["BindReadOnlyPaths"] == ["/opt/gpupool/venv"]
    timer = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-email.timer"))
    assert timer["Timer"]["OnCalendar"] == ["*:0/1"] and timer["Timer"]["Unit"] == ["gpupool-email.service"]


def test_the_example_runs_the_sender_and_the_idle_check_but_no_email_without_an_smtp_server(rendered: Rendered) -> None:
    assert summary(rendered.root, "ctl1")["runs"] == {"webhooks": True, "idle_check": True, "email": False}


def test_two_api_hosts_run_the_workers_on_one_and_the_smtp_password_is_the_email_units_alone(
        repo_root: Path, tmp_path: Path) -> None:
    inventory = example_copy(repo_root, tmp_path)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["api"]["hosts"] = {"ctl1": None, "gpu01": None}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    with (inventory / "group_vars" / "api.yml").open("a") as api_vars:
        api_vars.write(
            "gpupool_api_extra_environment:\n  GPUPOOL_CONTAINER_RUNTIME: pyxis\n  GPUPOOL_SMTP_HOST: smtp.example.com\n"
            "  GPUPOOL_SMTP_USERNAME: gpupool\n"
            "gpupool_api_smtp_password: render-smtp-password\n"
        )
    out = tmp_path / "out"
    ansible_dir = repo_root / "deploy" / "ansible"
    # The api role's tasks alone: the rest of the site is the module's example render's to show.
    run_playbook(ansible_dir, str(inventory), RENDER_PLAYBOOK, *render_arguments(ansible_dir, out, "--tags", "api"))
    # Exactly one webhook sender, idle check and email sender: the first API host's.
    assert summary(out, "ctl1")["runs"] == {"webhooks": True, "idle_check": True, "email": True}
    assert summary(out, "gpu01")["runs"] == {"webhooks": False, "idle_check": False, "email": False}
    credentials = out / "ctl1" / "etc/gpupool/credentials"
    service = unit_settings((out / "ctl1" / "etc/systemd/system/gpupool-email.service").read_text())["Service"]
    assert service["LoadCredential"] == [
        f"database_url:{credentials / 'email' / 'database_url'}", f"smtp_password:{credentials / 'email' / 'smtp_password'}",
    ]
    # systemd's own path to the unit's credentials (%d): no file another user could read.
    assert service["Environment"] == ["GPUPOOL_SMTP_PASSWORD_FILE=%d/smtp_password"]
    password = credentials / "email" / "smtp_password"
    assert password.read_text() == "render-smtp-password"
    assert password.stat().st_uid == 0 and stat.S_IMODE(password.stat().st_mode) == 0o600
    holders = [path for path in (out / "ctl1").rglob("*") if path.is_file() and "render-smtp-password" in path.read_text(errors="replace")]
    assert holders == [password]
    # Moved to the other API host: it runs them, the first stops its own.
    moved = tmp_path / "moved"
    run_playbook(ansible_dir, str(inventory), RENDER_PLAYBOOK,
                 *render_arguments(ansible_dir, moved, "--tags", "api", "-e", "gpupool_api_cluster_workers_host=gpu01"))
    assert summary(moved, "ctl1")["runs"] == {"webhooks": False, "idle_check": False, "email": False}
    assert summary(moved, "gpu01")["runs"] == {"webhooks": True, "idle_check": True, "email": True}


def test_an_smtp_password_in_a_file_of_the_environment_is_refused(repo_root: Path, tmp_path: Path) -> None:
    output = render_refused(
        repo_root / "deploy" / "ansible", tmp_path, "--tags", "api", "-e",
        json.dumps({"gpupool_api_extra_environment": {"GPUPOOL_SMTP_HOST": "smtp.example.com",
                                                      "GPUPOOL_SMTP_PASSWORD_FILE": "/etc/gpupool/smtp-password"}}),
    )
    assert "Give the SMTP password as gpupool_api_smtp_password" in output, output


def test_the_operator_is_told_by_email_and_webhook_set_in_group_vars_and_the_secret_is_the_senders_alone(
        repo_root: Path, tmp_path: Path) -> None:
    inventory = example_copy(repo_root, tmp_path)
    with (inventory / "group_vars" / "api.yml").open("a") as api_vars:
        api_vars.write(
            "gpupool_api_operator_email: ops@example.com\n"
            "gpupool_api_operator_webhook_url: https://alerts.example.com/gpupool\n"
            "gpupool_api_operator_webhook_secret: render-operator-webhook-secret\n"
        )
    out = tmp_path / "out"
    ansible_dir = repo_root / "deploy" / "ansible"
    run_playbook(ansible_dir, str(inventory), RENDER_PLAYBOOK, *render_arguments(ansible_dir, out, "--tags", "api"))
    environment = dict(line.split("=", 1) for line in config_lines((out / "ctl1" / "etc/gpupool/gpupool.env").read_text()))
    # Every unit's settings: billing enqueues the drain's email and node.drained, the senders send them.
    assert environment["GPUPOOL_OPERATOR_EMAIL"] == '"ops@example.com"'
    assert environment["GPUPOOL_OPERATOR_WEBHOOK_URL"] == '"https://alerts.example.com/gpupool"'
    assert "GPUPOOL_OPERATOR_WEBHOOK_SECRET" not in environment
    credentials = out / "ctl1" / "etc/gpupool/credentials"
    service = unit_settings((out / "ctl1" / "etc/systemd/system/gpupool-webhooks.service").read_text())["Service"]
    secret = credentials / "webhooks" / "operator_webhook_secret"
    assert service["LoadCredential"] == [
        f"database_url:{credentials / 'webhooks' / 'database_url'}", f"operator_webhook_secret:{secret}",
    ]
    assert secret.read_text() == "render-operator-webhook-secret"
    assert secret.stat().st_uid == 0 and stat.S_IMODE(secret.stat().st_mode) == 0o600
    holders = [path for path in (out / "ctl1").rglob("*")
               if path.is_file() and "render-operator-webhook-secret" in path.read_text(errors="replace")]
    assert holders == [secret]


def test_the_example_tells_the_operator_nothing_it_was_not_given(rendered: Rendered) -> None:
    environment = rendered.text("ctl1", "etc/gpupool/gpupool.env")
    assert "GPUPOOL_OPERATOR_" not in environment
    assert not rendered.path("ctl1", "etc/gpupool/credentials/webhooks/operator_webhook_secret").exists()


def test_an_operator_webhook_without_its_secret_is_refused(repo_root: Path, tmp_path: Path) -> None:
    output = render_refused(
        repo_root / "deploy" / "ansible", tmp_path, "--tags", "api", "-e",
        json.dumps({"gpupool_api_operator_webhook_url": "https://alerts.example.com/gpupool"}),
    )
    assert "given with gpupool_api_operator_webhook_secret" in output, output


def test_redis_asks_for_a_password_only_the_api_holds(rendered: Rendered) -> None:
    conf = rendered.path("ctl1", "etc/redis/gpupool.conf")
    info = conf.stat()
    assert info.st_uid == pwd.getpwnam("redis").pw_uid and stat.S_IMODE(info.st_mode) == 0o640
    assert config_lines(conf.read_text()) == ["bind 127.0.0.1 -::1", "port 6379", "protected-mode yes", "requirepass render-redis-password"]
    uri = rendered.path("ctl1", "etc/gpupool/credentials/api/ratelimit_storage_uri").read_text()
    assert uri == "redis://:render-redis-password@127.0.0.1:6379/0"
    holders = [path for path in rendered.path("ctl1", "etc").rglob("*") if path.is_file() and "render-redis-password" in path.read_text(errors="replace")]
    assert sorted(holders) == sorted([conf, rendered.path("ctl1", "etc/gpupool/credentials/api/ratelimit_storage_uri")])


def test_firewall_closes_the_service_ports_to_tenant_uids_on_every_host(rendered: Rendered) -> None:
    for host in ("ctl1", "gpu01", "gpu02"):
        rules = rendered.path(host, "etc/gpupool-firewall.nft")
        text = rules.read_text()
        closed = re.search(r"set tenant_closed_tcp \{[^}]*elements = \{ ([^}]*) \}", text)
        assert closed is not None, host
        assert [int(port) for port in closed.group(1).split(",")] == [2379, 2380, 3306, 5000, 5432, 6379, 6820, 8000, 8008, 9090, 9100, 9400], host
        rejects = [line.strip() for line in text.splitlines() if "reject" in line and not line.lstrip().startswith("#")]
        assert rejects and all(line.startswith("meta skuid 200000-299999 ") for line in rejects), host
        # The whole cluster: a job on gpu01 cannot reach ctl1's PostgreSQL or gpu02's exporters either.
        assert "elements = { 127.0.0.0/8, 10.0.0.10, 10.0.0.21, 10.0.0.22 }" in text, host
        # Slurm stays open to jobs (sbatch, srun, sacct); who else may connect is the port list's
        # (test_firewall_admits_each_service_port_only_from_the_hosts_that_need_it).
        assert "6817" not in closed.group(1), host
        # Only gpupool's own table is replaced: Docker's and the site's stay.
        assert "flush ruleset" not in text and "delete table inet gpupool" in text, host
        if shutil.which("nft"):
            subprocess.run(["nft", "-c", "-f", str(rules)], check=True, timeout=30, capture_output=True)


def test_an_accounts_user_is_never_put_in_the_docker_group(repo_root: Path, tmp_path: Path) -> None:
    for user in ("gp-acme", *[entry.pw_name for entry in pwd.getpwall() if 200000 <= entry.pw_uid <= 299999][:1]):
        output = render_refused(
            repo_root / "deploy" / "ansible", tmp_path, "--tags", "docker_users", "-e", json.dumps({"container_runtime_docker_users": [user]}),
        )
        assert f"{user} is an account's user" in output and "the docker group is root on the node" in output, output


def test_environment_file_reads_back_the_same_in_a_shell(rendered: Rendered) -> None:
    # The gpupool wrapper sources it with sh; systemd parses it with the same quoting rules.
    env_file = rendered.path("ctl1", "etc/gpupool/gpupool.env")
    shown = subprocess.run(
        ["sh", "-c", 'set -a; . "$1"; printf %s "$GPUPOOL_CONTAINER_ALLOWLIST"', "sh", str(env_file)],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert shown.stdout == "nvcr.io#nvidia/*,docker.io/library/*"


WRAPPER_EXEC = 'exec runuser -u "$run_as" -- /opt/gpupool/venv/bin/gpupool "$@"'


def test_gpupool_wrapper_is_valid_sh_and_drops_to_an_unprivileged_user(rendered: Rendered) -> None:
    wrapper = rendered.path("ctl1", "usr/local/sbin/gpupool")
    subprocess.run(["sh", "-n", str(wrapper)], timeout=10, check=True)
    assert WRAPPER_EXEC in wrapper.read_text()


def test_gpupool_wrapper_runs_billing_as_billing_and_the_rest_as_the_owner(rendered: Rendered, tmp_path: Path) -> None:
    # The wrapper as rendered, but showing the connections it would hand to gpupool.
    text = rendered.text("ctl1", "usr/local/sbin/gpupool")
    text = text.replace('cd "$state_dir"\n', "").replace(
        WRAPPER_EXEC,
        'printf "%s %s %s" "${GPUPOOL_DATABASE_URL-}" "${GPUPOOL_BILLING_DATABASE_URL-}" "${GPUPOOL_JWT_SECRET-}"',
    )
    probe = tmp_path / "gpupool"
    probe.write_text(text)

    def urls(*argv: str) -> list[str]:
        return subprocess.run(["sh", str(probe), *argv], capture_output=True, text=True, timeout=10, check=True).stdout.split()

    # Billing gets its own connection and nothing of the API's or the owner's.
    assert urls("billing", "run") == ["postgresql://gpupool_billing:render-billing-password@127.0.0.1/gpupool"]
    # The operator: the owner's connection and the key that signs tokens, not billing's.
    assert urls("price", "set", "rtx4090", "0.0001") == [
        "postgresql://gpupool_migrate:render-migrate-password@127.0.0.1/gpupool",
        "render-secret-not-for-use",
    ]


def test_gpupool_wrapper_creates_accounts_as_root_and_runs_the_rest_as_their_own_users(rendered: Rendered, tmp_path: Path) -> None:
    # The wrapper as rendered, but saying whom it would run gpupool as.
    text = rendered.text("ctl1", "usr/local/sbin/gpupool")
    text = text.replace('cd "$state_dir"\n', "")
    text = text.replace(WRAPPER_EXEC, 'echo "$run_as"; exit')
    text = text.replace('exec /opt/gpupool/venv/bin/gpupool "$@"', "echo root; exit")
    probe = tmp_path / "gpupool"
    probe.write_text(text)

    def runs_as(*argv: str) -> str:
        return subprocess.run(["sh", str(probe), *argv], capture_output=True, text=True, timeout=10, check=True).stdout.strip()

    assert runs_as("account", "create", "acme", "--gpu-limit", "8") == "root"
    assert runs_as("member", "migrate", "acme") == "root"  # members' Unix users
    assert runs_as("account", "sync") == "root"  # every account's Slurm association
    assert runs_as("member", "set", "acme", "bob", "--role", "member") == "gpupool-operator"
    # Never the API's user (gpupool), which could read the owner's password in the environment.
    assert runs_as("account", "list", "--json") == "gpupool-operator"
    assert runs_as("billing", "run") == "gpupool-billing"
    assert runs_as("token", "create", "--user", "alice", "--account", "create") == "gpupool-operator"


def test_nginx_terminates_tls_and_hides_metrics(rendered: Rendered) -> None:
    site = rendered.text("ctl1", "etc/nginx/sites-available/gpupool")
    assert "listen 443 ssl" in site
    assert "proxy_protocol" not in site and "set_real_ip_from" not in site  # no load balancer in front: nobody to believe
    assert f"ssl_certificate {rendered.path('ctl1', LETSENCRYPT)}/fullchain.pem;" in site
    assert f"ssl_certificate_key {rendered.path('ctl1', LETSENCRYPT)}/privkey.pem;" in site
    assert re.search(r"location = /metrics \{\s*return 404;", site)
    assert "server 127.0.0.1:8000;" in site


def test_prometheus_scrapes_the_api_and_each_gpu_node(rendered: Rendered) -> None:
    config = yaml.safe_load(rendered.text("ctl1", "etc/prometheus/prometheus.yml"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = {name: [t for group in job["static_configs"] for t in group["targets"]] for name, job in jobs.items()}
    assert targets["gpupool_api"] == ["localhost:8000"]
    assert targets["gpu"] == ["10.0.0.21:9400", "10.0.0.22:9400"]
    assert set(targets["node"]) == {"10.0.0.10:9100", "10.0.0.21:9100", "10.0.0.22:9100"}


def test_rendering_again_changes_nothing(rendered: Rendered) -> None:
    assert rendered.first.changed["gpu01"] > 0
    assert rendered.second.changed == {"ctl1": 0, "gpu01": 0, "gpu02": 0}, rendered.second.output


def test_cron_can_run_billing_instead_of_the_timer(repo_root: Path, tmp_path: Path) -> None:
    render(repo_root / "deploy" / "ansible", tmp_path, "--tags", "api", "-e", "gpupool_api_billing_scheduler=cron")
    cron = config_lines((tmp_path / "ctl1" / "etc" / "cron.d" / "gpupool-billing").read_text())
    wrapper = tmp_path / "ctl1" / "usr" / "local" / "sbin" / "gpupool"
    assert cron[-1] == f"*/5 * * * * root flock --nonblock /run/lock/gpupool-billing.lock {wrapper} billing run"


def _flags(defaults_file: str) -> list[str]:
    """The ARGS of an /etc/default file of Ubuntu's Prometheus packages, as the shell splits them."""
    line = next(line for line in config_lines(defaults_file) if line.startswith("ARGS="))
    return shlex.split(shlex.split(line.partition("=")[2])[0])


def test_monitoring_listens_on_each_hosts_private_address_only(rendered: Rendered) -> None:
    for host, address in (("gpu01", "10.0.0.21"), ("gpu02", "10.0.0.22")):
        exporter = unit_settings(rendered.text(host, "etc/systemd/system/gpu-exporter.service"))["Service"]["ExecStart"]
        assert exporter == [f"/usr/local/lib/nvidia_gpu_exporter-1.3.1/nvidia_gpu_exporter --web.listen-address={address}:9400"]
    for host, address in (("ctl1", "10.0.0.10"), ("gpu01", "10.0.0.21"), ("gpu02", "10.0.0.22")):
        assert _flags(rendered.text(host, "etc/default/prometheus-node-exporter")) == [f"--web.listen-address={address}:9100"]
    assert _flags(rendered.text("ctl1", "etc/default/prometheus")) == [
        "--web.listen-address=10.0.0.10:9090",
        "--storage.tsdb.retention.time=30d",
    ]
    # Prometheus finds itself where it now listens, not on localhost.
    config = yaml.safe_load(rendered.text("ctl1", "etc/prometheus/prometheus.yml"))
    own = next(job for job in config["scrape_configs"] if job["job_name"] == "prometheus")
    assert own["static_configs"][0]["targets"] == ["10.0.0.10:9090"]
    assert rendered.second.changed == {"ctl1": 0, "gpu01": 0, "gpu02": 0}, rendered.second.output


# --- tenants: each account's Unix user on every compute node ---------------------------

# Names no machine running these tests has. rndacme has two members with users of their own.
ACME_MEMBERS = [{"unix_user": "gp-251011-rndacme", "unix_uid": 251011}, {"unix_user": "gp-251012-rndacme", "unix_uid": 251012}]
TENANT_ACCOUNTS = [
    {"account": "rndacme", "unix_user": "gp-rndacme", "unix_uid": 251001, "members": ACME_MEMBERS},
    {"account": "rndbeta", "unix_user": "gp-rndbeta", "unix_uid": 251002, "members": []},
    # Made before tenants: no Unix user until `gpupool account create` runs for it again.
    {"account": "rndlegacy", "unix_user": None, "unix_uid": None},
]


def fake_gpupool(folder: Path, accounts: list[dict[str, object]]) -> Path:
    """Stands in for the API host's gpupool command: answers `account list --json` only."""
    script = folder / "gpupool"
    script.write_text(f"#!/bin/sh\n[ \"$*\" = 'account list --json' ] || exit 2\necho {shlex.quote(json.dumps(accounts))}\n")
    script.chmod(0o755)
    return script


def plan_tenants(repo_root: Path, out: Path, accounts: list[dict[str, object]]) -> PlaybookRun:
    """The tenants step in check mode (tests/render.yml, --tags tenants), reading the accounts from the API host."""
    cli = fake_gpupool(out, accounts)
    return render(repo_root / "deploy" / "ansible", out, "--tags", "tenants", "-e", f"tenants_cli={cli}", "-e", "tenants_from_api=true")


def test_tenants_step_gives_each_compute_node_every_accounts_user(repo_root: Path, tmp_path: Path) -> None:
    plan_tenants(repo_root, tmp_path, TENANT_ACCOUNTS)
    created = {host: json.loads((tmp_path / f"{host}-tenants.json").read_text()) for host in ("ctl1", "gpu01", "gpu02")}
    assert created["gpu01"] == created["gpu02"] == TENANT_ACCOUNTS[:2]
    # ctl1, the controller, needs them too (on a real API host `gpupool account
    # create` made them already; this machine has none).
    assert created["ctl1"] == TENANT_ACCOUNTS[:2]
    # And every member's own user, everywhere its account's is.
    for host in ("ctl1", "gpu01", "gpu02"):
        assert json.loads((tmp_path / f"{host}-tenant-members.json").read_text()) == ACME_MEMBERS, host
    for account in TENANT_ACCOUNTS[:2]:
        with pytest.raises(KeyError):
            pwd.getpwnam(str(account["unix_user"]))  # check mode: nothing was made here


def test_tenants_step_refuses_a_uid_outside_the_tenant_range(repo_root: Path, tmp_path: Path) -> None:
    # A regular user's uid: the run-as helper would refuse to act as it.
    with pytest.raises(AssertionError, match="uid from 200000 to 299999"):
        plan_tenants(repo_root, tmp_path, [{"account": "rndlow", "unix_user": "gp-rndlow", "unix_uid": 1000}])
    # A member's user likewise.
    member = {"unix_user": "gp-1000-rndlow", "unix_uid": 1000}
    with pytest.raises(AssertionError, match="member user gp-1000-rndlow with uid 1000 must be"):
        plan_tenants(repo_root, tmp_path, [{"account": "rndlow", "unix_user": "gp-rndlow", "unix_uid": 251003, "members": [member]}])


# --- container runtime: the Prolog and Epilog slurmd runs around every job --------------

PROLOG = "usr/local/sbin/gpupool-container-prolog"
EPILOG = "usr/local/sbin/gpupool-container-epilog"


def run_hook(script: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a hook as slurmd does: as root, with the job's SLURM_* variables and little else."""
    return subprocess.run(["/bin/bash", str(script)], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=60, check=False)


def test_container_runtime_slurm_runs_the_hooks_on_every_host(rendered: Rendered) -> None:
    settings = config_lines(rendered.text("ctl1", "etc/slurm/slurm.conf"))
    assert "Prolog=/usr/local/sbin/gpupool-container-prolog" in settings
    assert "Epilog=/usr/local/sbin/gpupool-container-epilog" in settings
    for host in ("gpu01", "gpu02"):
        for hook in (PROLOG, EPILOG):
            path = rendered.path(host, hook)
            info = path.stat()
            assert stat.S_IMODE(info.st_mode) == 0o755 and info.st_uid == 0, (host, hook)
            subprocess.run(["/bin/bash", "-n", str(path)], timeout=10, check=True)
    assert not rendered.path("ctl1", EPILOG).exists()  # slurmd runs them; the controller has none


def test_container_runtime_epilog_removes_the_jobs_docker_and_enroot_containers(rendered: Rendered) -> None:
    text = rendered.text("gpu01", EPILOG)
    # The label gpupool's docker job script puts on the container (gpupool/render.py).
    assert f'--filter "label={DOCKER_JOB_LABEL}=$job_id"' in text
    assert 'docker rm --force $ids' in text
    assert '"pyxis_${job_id}_"* | "pyxis_${job_id}."*)' in text


@pytest.mark.parametrize("job_env", [{"SLURM_JOB_ID": "77", "SLURM_JOB_USER": "nobody"}, {}, {"SLURM_JOB_ID": "77;reboot"}])
def test_container_runtime_epilog_never_drains_the_node(rendered: Rendered, job_env: dict[str, str]) -> None:
    # Neither docker nor enroot is installed here: the hook must still end in success.
    assert run_hook(rendered.path("gpu01", EPILOG), **job_env).returncode == 0


def test_container_runtime_prolog_gives_the_job_user_private_enroot_folders(rendered: Rendered, tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    host_root = rendered.path("gpu02", "")
    folders = [host_root / root / f"user-{nobody.pw_uid}" for root in ("run/enroot", "var/lib/enroot/cache", "var/lib/enroot/data")]
    # Another user got there first: a folder of its own, and a link to somewhere else.
    planted = folders[2] / "pyxis_1_x"
    planted.mkdir(parents=True)
    os.chown(folders[2], nobody.pw_uid + 1, nobody.pw_gid)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folders[0].parent.mkdir(parents=True)
    folders[0].symlink_to(elsewhere)

    job = {"SLURM_JOB_ID": "78", "SLURM_JOB_UID": str(nobody.pw_uid), "SLURM_JOB_GID": str(nobody.pw_gid)}
    assert run_hook(rendered.path("gpu02", PROLOG), **job).returncode == 0
    for folder in folders:
        info = folder.lstat()
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700, folder
        assert (info.st_uid, info.st_gid) == (nobody.pw_uid, nobody.pw_gid), folder
    assert not planted.exists()
    assert elsewhere.is_dir()  # the link was replaced, not followed
    assert run_hook(rendered.path("gpu02", PROLOG), **job).returncode == 0  # and again, unchanged
    assert run_hook(rendered.path("gpu02", PROLOG), SLURM_JOB_UID="x").returncode == 0


def test_container_runtime_off_leaves_slurm_conf_without_hooks(repo_root: Path, tmp_path: Path) -> None:
    # inventories/local turns the role off, and gathers accounting from /proc: its slurm.conf must stay as it was.
    render(
        repo_root / "deploy" / "ansible", tmp_path, *SLURM_FILES, "-e", "container_runtime_enabled=false",
        "-e", "slurm_common_jobacct_gather_type=jobacct_gather/linux",
    )
    settings = config_lines((tmp_path / "ctl1" / "etc" / "slurm" / "slurm.conf").read_text())
    assert not [line for line in settings if line.startswith(("Prolog=", "Epilog="))]
    assert not (tmp_path / "gpu01" / EPILOG).exists()
    assert "JobAcctGatherType=jobacct_gather/linux" in settings
    assert "ProctrackType=proctrack/cgroup" in settings


# --- issue 8: a multi-node first install that converges -----------------------------------

ANSIBLE_DIR_PARTS = ("deploy", "ansible")


def test_ubuntu_22_04_and_24_04_each_render_twice_without_change(rendered: Rendered, rendered_noble: Rendered) -> None:
    for run in (rendered, rendered_noble):
        assert run.second.changed == {"ctl1": 0, "gpu01": 0, "gpu02": 0}, run.second.output
    assert summary(rendered.root, "gpu01")["slurm_versions"] == {"slurmd": "21.08.5-2ubuntu1"}
    assert summary(rendered_noble.root, "ctl1")["slurm_versions"] == {
        "slurm-client": "23.11.4-1.2ubuntu5", "slurmctld": "23.11.4-1.2ubuntu5", "slurmdbd": "23.11.4-1.2ubuntu5",
    }


def test_slurm_version_mix_of_22_04_and_24_04_is_refused_naming_hosts(repo_root: Path, tmp_path: Path) -> None:
    # The example's controller on 22.04 (21.08), gpu02 installed from 24.04 (23.11).
    output = render_refused(
        repo_root.joinpath(*ANSIBLE_DIR_PARTS), tmp_path, "--tags", "versions",
        "-e", json.dumps({"render_slurm_versions": {"gpu02": "23.11.4-1.2ubuntu5 (apt candidate, not installed yet)"}}),
    )
    assert (
        "slurmd 23.11.4-1.2ubuntu5 (apt candidate, not installed yet) on gpu02 is newer than "
        "slurmctld 21.08.5-2ubuntu1 on ctl1"
    ) in output


@pytest.mark.parametrize(
    ("versions", "refusal"),
    [
        # 23.11 talks to 23.02 and 22.05 (two earlier releases).
        ({"ctl1": "23.11.4-1", "gpu01": "23.02.7-1", "gpu02": "22.05.8-4"}, None),
        # 21.08 is three releases behind 23.11.
        (
            {"ctl1": "23.11.4-1", "gpu01": "23.11.4-1", "gpu02": "21.08.5-2ubuntu1"},
            "slurmd 21.08.5-2ubuntu1 on gpu02 is 3 major releases behind slurmctld 23.11.4-1 on ctl1 "
            "(21.08 -> 22.05 -> 23.02 -> 23.11); Slurm 23.11 works with at most 2 earlier releases (23.02, 22.05).",
        ),
        # From 24.11 on, three earlier releases: 24.11 still talks to 23.02, 25.05 no longer does.
        ({"ctl1": "24.11.1-1", "gpu01": "23.02.7-1", "gpu02": "24.05.4-1"}, None),
        (
            {"ctl1": "25.05.0-1", "gpu01": "23.02.7-1", "gpu02": "25.05.0-1"},
            "slurmd 23.02.7-1 on gpu01 is 4 major releases behind slurmctld 25.05.0-1 on ctl1",
        ),
    ],
)
def test_slurm_versions_within_slurms_release_window(
    repo_root: Path, tmp_path: Path, versions: dict[str, str], refusal: str | None,
) -> None:
    ansible_dir = repo_root.joinpath(*ANSIBLE_DIR_PARTS)
    arguments = ("--tags", "versions", "-e", json.dumps({"render_slurm_versions": versions}))
    if refusal is None:
        render(ansible_dir, tmp_path, *arguments)
    else:
        assert refusal in render_refused(ansible_dir, tmp_path, *arguments)


# --- issue 32: no unconfined tenants, security floors --------------------------------------


def test_tenants_jobs_run_unconfined_only_with_the_operators_reason(repo_root: Path, tmp_path: Path) -> None:
    ansible_dir = repo_root.joinpath(*ANSIBLE_DIR_PARTS)
    linuxproc = ("--tags", "confinement", "-e", "slurm_common_proctrack_type=proctrack/linuxproc")
    refused = render_refused(ansible_dir, tmp_path, *linuxproc)
    for host in ("ctl1", "gpu01", "gpu02"):
        assert (
            f"ProctrackType=proctrack/linuxproc (slurm_common_proctrack_type) on {host} would run tenants' jobs "
            "unconfined: a process a job starts with setsid or a double fork outlives the job"
        ) in refused
    assert "set slurm_common_unconfined_jobs_reason to the reason why" in refused
    # A reason of blanks is no reason.
    assert "would run tenants' jobs unconfined" in render_refused(
        ansible_dir, tmp_path, *linuxproc, "-e", json.dumps({"slurm_common_unconfined_jobs_reason": "  "}))
    render(ansible_dir, tmp_path, *linuxproc, "-e", json.dumps({"slurm_common_unconfined_jobs_reason": "no cgroups here"}))
    render(ansible_dir, tmp_path, "--tags", "confinement")  # the default, proctrack/cgroup


def cgroup_v1_like(out: Path, host: str, *controllers: str) -> None:
    """A host with these cgroup v1 hierarchies (and the unified one beside them, as a hybrid host has)."""
    root = out / host / "sys" / "fs" / "cgroup"
    for controller in (*controllers, "systemd"):
        (root / controller).mkdir(parents=True, exist_ok=True)
        (root / controller / "tasks").write_text("")
    (root / "unified").mkdir(exist_ok=True)
    (root / "unified" / "cgroup.controllers").write_text("")


def test_a_node_without_the_cgroups_slurms_plugins_use_is_refused_before_any_change(repo_root: Path, tmp_path: Path) -> None:
    # What systemd mounts in a container on a kernel with cpu and cpuacct apart: no cpuacct.
    ansible_dir = repo_root.joinpath(*ANSIBLE_DIR_PARTS)
    cgroup_v1_like(tmp_path, "gpu01", "freezer", "memory", "cpuset", "devices", "pids")
    cgroup_v1_like(tmp_path, "gpu02", "memory", "cpuset", "devices", "cpuacct")
    refused = render_refused(ansible_dir, tmp_path, "--tags", "driver")
    assert (
        f"gpu01 has no cgroup v1 hierarchy for cpuacct under {tmp_path}/gpu01/sys/fs/cgroup, which "
        "JobAcctGatherType=jobacct_gather/cgroup (slurm_common_jobacct_gather_type) needs: slurmd would not start."
    ) in refused
    assert (
        f"gpu02 has no cgroup v1 hierarchy for freezer under {tmp_path}/gpu02/sys/fs/cgroup, which "
        "ProctrackType=proctrack/cgroup (slurm_common_proctrack_type) needs"
    ) in refused
    # Accounting from /proc needs no cpuacct: gpu01 passes; gpu02 still has no freezer.
    refused = render_refused(ansible_dir, tmp_path, "--tags", "driver", "-e", "slurm_common_jobacct_gather_type=jobacct_gather/linux")
    assert "gpu01 has no cgroup" not in refused and "gpu02 has no cgroup v1 hierarchy for freezer" in refused
    cgroup_v1_like(tmp_path, "gpu02", "freezer")
    render(ansible_dir, tmp_path, "--tags", "driver", "-e", "slurm_common_jobacct_gather_type=jobacct_gather/linux")


FLOOR_ADVICE = "Upgrade them from the security archive (apt-get install --only-upgrade"


@pytest.mark.parametrize(
    ("builds", "extra", "refusals"),
    [
        # The releases' builds as the render stands them in pass, and so do later ones (Ubuntu Pro's).
        ({}, {}, []),
        ({"gpu01": {"slurmd": "21.08.5-2ubuntu1+esm2", "libmunge2": "0.5.14-6ubuntu0.2"}}, {}, []),
        # Older builds, installed or about to be, stop their host: the floor, where it is kept, what to run.
        (
            {"gpu01": {"slurmd": "21.08.5-2"}, "ctl1": {"munge": "0.5.14-6 (apt candidate, not installed yet)"}},
            {},
            [
                "slurmd 21.08.5-2 on gpu01 is below its security floor 21.08.5-2ubuntu1 (slurm_common_version_floor, Ubuntu jammy).",
                f"{FLOOR_ADVICE} slurmd)",
                "munge 0.5.14-6 (apt candidate, not installed yet) on ctl1 is below its security floor 0.5.14-6ubuntu0.1 "
                "(munge_version_floor, Ubuntu jammy).",
                f"{FLOOR_ADVICE} munge)",
            ],
        ),
        # Debian's order, not Ansible's version test: a ~ build comes before the build it names.
        (
            {"gpu02": {"libmunge2": "0.5.14-6ubuntu0.1~rc1", "slurm-client": "21.08.5-2ubuntu0.9"}},
            {},
            [
                "libmunge2 0.5.14-6ubuntu0.1~rc1 on gpu02 is below its security floor 0.5.14-6ubuntu0.1",
                "slurm-client 21.08.5-2ubuntu0.9 on gpu02 is below its security floor 21.08.5-2ubuntu1",
                f"{FLOOR_ADVICE} libmunge2 slurm-client)",
            ],
        ),
        # A release without a floor is refused until one is added.
        (
            {},
            {"munge_version_floor": {"noble": "0.5.15-4ubuntu0.1"}},
            ["munge has no security floor for Ubuntu jammy in munge_version_floor: add the oldest build"],
        ),
    ],
)
def test_munge_and_slurm_builds_below_their_security_floors_are_refused(
    repo_root: Path, tmp_path: Path, builds: dict[str, dict[str, str]], extra: dict[str, object], refusals: list[str],
) -> None:
    ansible_dir = repo_root.joinpath(*ANSIBLE_DIR_PARTS)
    arguments = ("--tags", "versions", "-e", json.dumps({"render_package_versions": builds, **extra}))
    if not refusals:
        render(ansible_dir, tmp_path, *arguments)
        return
    output = render_refused(ansible_dir, tmp_path, *arguments)
    for refusal in refusals:
        assert refusal in output
    failed = {host for host in ("ctl1", "gpu01", "gpu02") if re.search(rf"^{host}\s*:.*failed=1", output, re.MULTILINE)}
    assert failed == (set(builds) or {"ctl1", "gpu01", "gpu02"})


def test_cgroup_v1_boot_option_on_22_04_shares_the_drivers_single_reboot(rendered: Rendered, rendered_noble: Rendered) -> None:
    dropin = "etc/default/grub.d/90-gpupool-cgroup-v1.cfg"
    for host in ("gpu01", "gpu02"):
        assert 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT systemd.unified_cgroup_hierarchy=0"' in config_lines(
            rendered.text(host, dropin)
        )
        # One reason, noted for the single reboot (common's reboot.yml), not a stop of its own.
        assert summary(rendered.root, host)["reboot_reasons"] == [
            "cgroup v1 controllers for Slurm 21.08 (systemd.unified_cgroup_hierarchy=0)"
        ]
        # 24.04's Slurm 23.11 has cgroup v2: no boot option, no reboot.
        assert not rendered_noble.path(host, dropin).exists()
        assert summary(rendered_noble.root, host)["reboot_reasons"] == []
    assert summary(rendered.root, "ctl1")["reboot_reasons"] == []


def test_cgroup_v1_node_rebooted_with_the_option_needs_no_more_reboots(repo_root: Path, tmp_path: Path) -> None:
    for host in ("gpu01", "gpu02"):
        boot_like(out=tmp_path, host=host, cgroup_v2_only=False, cmdline="ro quiet systemd.unified_cgroup_hierarchy=0")
    render(repo_root.joinpath(*ANSIBLE_DIR_PARTS), tmp_path, "--tags", "driver")
    assert summary(tmp_path, "gpu01")["reboot_reasons"] == []


def test_nvidia_driver_headless_server_packages_with_dkms_without_secure_boot(rendered: Rendered) -> None:
    for host in ("gpu01", "gpu02"):
        assert summary(rendered.root, host)["secure_boot_on"] is False
        assert summary(rendered.root, host)["driver_packages"] == ["nvidia-headless-535-server", "nvidia-utils-535-server"]
    assert summary(rendered.root, "ctl1")["driver_packages"] is None  # no GPU, no driver


def test_nvidia_driver_canonicals_signed_modules_under_secure_boot(rendered_noble: Rendered, repo_root: Path, tmp_path: Path) -> None:
    assert summary(rendered_noble.root, "gpu01")["secure_boot_on"] is True
    assert summary(rendered_noble.root, "gpu01")["driver_packages"] == [
        "linux-modules-nvidia-535-server-generic",
        "nvidia-headless-no-dkms-535-server",
        "nvidia-utils-535-server",
    ]
    # 22.04 with the HWE kernel installed: the modules of its flavour.
    render(repo_root.joinpath(*ANSIBLE_DIR_PARTS), tmp_path, "--tags", "driver", "-e", "render_secure_boot=true")
    assert summary(tmp_path, "gpu02")["driver_packages"][0] == "linux-modules-nvidia-535-server-generic-hwe-22.04"


def test_slurm_accounts_jobs_from_their_cgroups_in_production(rendered: Rendered) -> None:
    assert "JobAcctGatherType=jobacct_gather/cgroup" in config_lines(rendered.text("ctl1", "etc/slurm/slurm.conf"))


def test_tls_without_a_certificate_serves_a_self_signed_one(rendered_noble: Rendered) -> None:
    assert summary(rendered_noble.root, "ctl1")["tls_mode"] == "self_signed"
    site = rendered_noble.text("ctl1", "etc/nginx/sites-available/gpupool")
    tls = rendered_noble.path("ctl1", "etc/gpupool/tls")
    assert f"ssl_certificate {tls}/selfsigned.crt;" in site
    assert f"ssl_certificate_key {tls}/selfsigned.key;" in site
    certificate = subprocess.run(
        ["openssl", "x509", "-noout", "-subject", "-in", str(tls / "selfsigned.crt")],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout
    assert "CN = gpupool.example.com" in certificate  # gpupool_api_server_name
    assert stat.S_IMODE((tls / "selfsigned.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(tls.stat().st_mode) == 0o700


def test_tls_port_80_answers_certbots_challenge(rendered: Rendered) -> None:
    site = rendered.text("ctl1", "etc/nginx/sites-available/gpupool")
    webroot = rendered.path("ctl1", "var/www/letsencrypt")
    assert re.search(r"location /\.well-known/acme-challenge/ \{\s*root " + re.escape(str(webroot)) + ";", site)
    assert "return 301 https://$host$request_uri;" in site
    assert webroot.is_dir()


def test_the_api_site_answers_503_json_while_gunicorn_is_down_and_passes_the_apis_own_answers(
    rendered: Rendered, tmp_path: Path,
) -> None:
    """nginx as rendered (only its ports and its certificate made here), in front of no gunicorn, then one."""
    if not Path(NGINX).exists():
        pytest.fail("nginx is missing: make venv-test installs nginx-light")
    site = rendered.text("ctl1", "etc/nginx/sites-available/gpupool")
    https, plain, upstream = free_port(), free_port(), free_port()
    site = re.sub(r"^\s*listen \[::\].*$", "", site, flags=re.MULTILINE)
    site = site.replace("listen 443 ssl http2;", f"listen 127.0.0.1:{https} ssl http2;").replace("listen 80;", f"listen 127.0.0.1:{plain};")
    site = re.sub(r"(upstream gpupool_api \{\s*server )[^;]+;", rf"\g<1>127.0.0.1:{upstream};", site)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=gpupool.example.com",
                    "-keyout", str(tmp_path / "site.key"), "-out", str(tmp_path / "site.crt")],
                   capture_output=True, timeout=60, check=True)
    site = re.sub(r"ssl_certificate [^;]+;", f"ssl_certificate {tmp_path}/site.crt;", site)
    site = re.sub(r"ssl_certificate_key [^;]+;", f"ssl_certificate_key {tmp_path}/site.key;", site)
    (tmp_path / "site.conf").write_text(site)
    (tmp_path / "nginx.conf").write_text(
        f"user root;\ndaemon off;\npid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\n    access_log off;\n    include {tmp_path}/site.conf;\n}}\n"
    )
    nginx = subprocess.Popen([NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")], stderr=subprocess.PIPE)
    try:
        def get() -> httpx.Response | None:
            try:
                return httpx.get(f"https://127.0.0.1:{https}/jobs", headers={"Host": "gpupool.example.com"}, verify=False, timeout=5)
            except httpx.TransportError:
                assert nginx.poll() is None, nginx.stderr.read() if nginx.stderr else ""
                return None

        down = wait_for(get, timeout_s=20, interval_s=0.2, what="nginx to answer")
        assert down is not None
        # What a client sees from a host whose gunicorn was killed: the API's error shape, to retry.
        assert down.status_code == 503, down.text
        assert down.headers["content-type"] == "application/json" and down.headers["retry-after"] == "5"
        assert down.json()["error"] == "api_unavailable" and "Idempotency-Key" in down.json()["message"]
        assert down.headers["strict-transport-security"] == "max-age=31536000"
        # The API's own 503 (its database away, say) reaches the client as the API wrote it.
        own = b'{"error": "database_unavailable", "message": "the database did not answer"}'

        class Api(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Retry-After", "2")
                self.send_header("Content-Length", str(len(own)))
                self.end_headers()
                self.wfile.write(own)

            def log_message(self, *args: object) -> None:
                pass

        with http.server.HTTPServer(("127.0.0.1", upstream), Api) as api:
            threading.Thread(target=api.serve_forever, daemon=True).start()
            try:
                answered = get()
            finally:
                api.shutdown()
        assert answered is not None and answered.status_code == 503 and answered.content == own
        assert answered.headers["retry-after"] == "2"
    finally:
        nginx.terminate()
        nginx.wait(timeout=10)


def test_tls_http_fallback_listens_on_the_private_address_only(repo_root: Path, tmp_path: Path) -> None:
    render(repo_root.joinpath(*ANSIBLE_DIR_PARTS), tmp_path, "--tags", "api", "-e", "gpupool_api_tls_fallback=http")
    site = (tmp_path / "ctl1" / "etc" / "nginx" / "sites-available" / "gpupool").read_text()
    assert [line.strip() for line in config_lines(site) if line.strip().startswith("listen")] == ["listen 10.0.0.10:80;"]
    assert "ssl_certificate" not in site


def test_backup_dumps_the_database_nightly_and_keeps_two_weeks(rendered: Rendered) -> None:
    unit = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-backup.service"))
    service = unit["Service"]
    assert unit["Unit"]["Requires"] == ["postgresql.service"]  # one database host: Debian's cluster
    script = rendered.path("ctl1", "usr/local/sbin/gpupool-backup")
    assert service["User"] == ["postgres"] and service["ExecStart"] == [str(script)]
    timer = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-backup.timer"))
    assert timer["Timer"]["OnCalendar"] == ["*-*-* 03:17:00"] and timer["Timer"]["Persistent"] == ["true"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]
    subprocess.run(["sh", "-n", str(script)], timeout=10, check=True)
    text = script.read_text()
    assert "pg_dump --format=custom" in text and "gpupool" in text
    assert "-mtime +14 -delete" in text
    assert "pg_restore --clean --if-exists --dbname gpupool FILE" in text  # how to restore, where an operator looks
    backups = rendered.path("ctl1", "var/backups/gpupool")
    assert stat.S_IMODE(backups.stat().st_mode) == 0o700 and backups.stat().st_uid == pwd.getpwnam("postgres").pw_uid


def test_enroot_gets_an_apparmor_profile_on_24_04_not_a_host_wide_switch(rendered: Rendered, rendered_noble: Rendered) -> None:
    for host in ("gpu01", "gpu02"):
        profile = rendered_noble.text(host, "etc/apparmor.d/enroot-nsenter")
        assert "abi <abi/4.0>," in profile
        assert re.search(r"^/usr/bin/enroot-nsenter flags=\(unconfined\) \{\s*userns,", profile, re.MULTILINE)
        assert not rendered.path(host, "etc/apparmor.d/enroot-nsenter").exists()  # 22.04: no restriction, no profile
    assert not rendered_noble.path("gpu01", "etc/sysctl.d/90-enroot-userns.conf").exists()


def test_shared_storage_exports_without_root_squash_to_the_api_hosts_only(repo_root: Path, tmp_path: Path) -> None:
    # An NFS server that is not the API host, so that the API host is a client too.
    render(repo_root.joinpath(*ANSIBLE_DIR_PARTS), tmp_path, "--tags", "storage", "-e", "shared_storage_nfs_server=gpu02")
    export = config_lines((tmp_path / "gpu02" / "etc" / "exports.d" / "gpupool.exports").read_text())
    shared = tmp_path / "shared" / "srv" / "gpupool"
    assert export == [
        f"{shared} 10.0.0.10(rw,sync,no_subtree_check,sec=sys,crossmnt,no_root_squash) 10.0.0.21(rw,sync,no_subtree_check,sec=sys,crossmnt,root_squash)"
    ]
    for host in ("ctl1", "gpu01"):
        assert config_lines((tmp_path / host / "etc" / "fstab").read_text()) == [
            f"10.0.0.22:{shared} {shared} nfs nfsvers=4.2,hard,noatime,_netdev 0 0"
        ]
    job_root = shared / "jobs"
    assert stat.S_IMODE(job_root.stat().st_mode) == 0o711
    assert not [path for path in job_root.iterdir()]  # the check file is gone, the tenant folders are gpupool's


def test_shared_storage_check_stops_when_a_node_does_not_see_the_job_root(repo_root: Path, tmp_path: Path) -> None:
    output = render_refused(
        repo_root.joinpath(*ANSIBLE_DIR_PARTS), tmp_path, "--tags", "storage", "-e", json.dumps({"render_blind_hosts": ["gpu02"]}),
    )
    assert re.search(r"gpu02 cannot read \S+/shared/srv/gpupool/jobs/\.gpupool-storage-check-[0-9a-f]+, which ctl1 just wrote", output)
    assert "gpu01 cannot read" not in output and "gpu01, gpu02" not in output
    assert not list((tmp_path / "shared" / "srv" / "gpupool" / "jobs").iterdir())


def test_a_dead_compute_node_is_skipped_and_keeps_its_slurm_conf_line(rendered: Rendered, repo_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "render"
    shutil.copytree(rendered.root, out, symlinks=True)
    before = (out / "ctl1" / "etc" / "slurm" / "slurm.conf").read_text()
    api_unit = out / "ctl1" / "etc" / "systemd" / "system" / "gpupool-api.service"
    api_unit.unlink()
    output = render_refused(
        repo_root.joinpath(*ANSIBLE_DIR_PARTS), out, "--tags", "driver,slurm,api", "-e", json.dumps({"render_fail_hosts": ["gpu02"]})
    )
    recap = output[output.rfind("PLAY RECAP"):]
    assert re.search(r"^gpu02\s*:.*failed=1", recap, re.MULTILINE)
    assert re.search(r"^ctl1\s*:.*failed=0", recap, re.MULTILINE) and re.search(r"^gpu01\s*:.*failed=0", recap, re.MULTILINE)
    assert "gpu02 is unreachable or failed earlier in this run (see the recap): its node line stays as the controller has it" in output
    # Unchanged on the controller and the live node: gpu02's line and its GPU type stay.
    assert (out / "ctl1" / "etc" / "slurm" / "slurm.conf").read_text() == before
    assert (out / "gpu01" / "etc" / "slurm" / "slurm.conf").read_text() == before
    # The API host's configuration still converged.
    assert api_unit.exists()


def test_a_dead_node_never_configured_joins_slurm_conf_at_a_later_run(repo_root: Path, tmp_path: Path) -> None:
    # A first install with gpu02 down: the others converge without it.
    output = render_refused(repo_root.joinpath(*ANSIBLE_DIR_PARTS), tmp_path, *SLURM_FILES, "-e", json.dumps({"render_fail_hosts": ["gpu02"]}))
    assert "gpu02 is unreachable or failed earlier in this run (see the recap): it has no node line yet" in output
    settings = config_lines((tmp_path / "ctl1" / "etc" / "slurm" / "slurm.conf").read_text())
    assert [line.split()[0] for line in settings if line.startswith("NodeName=")] == ["NodeName=gpu01"]
    assert next(line for line in settings if line.startswith("AccountingStorageTRES=")) == "AccountingStorageTRES=gres/gpu,gres/gpu:rtx4090"


# --- what the roles fetch and install ------------------------------------------------------


def role_tasks(repo_root: Path) -> Iterator[tuple[Path, dict[str, object]]]:
    """Every task (blocks opened) of every role's task files."""

    def walk(tasks: list[dict[str, object]]) -> Iterator[dict[str, object]]:
        for task in tasks or []:
            yield task
            for key in ("block", "rescue", "always"):
                yield from walk(task.get(key) or [])  # type: ignore[arg-type]

    for path in sorted(repo_root.joinpath(*ANSIBLE_DIR_PARTS, "roles").glob("*/tasks/*.yml")):
        for task in walk(yaml.safe_load(path.read_text()) or []):
            yield path, task


def test_every_download_is_checked_against_a_pinned_checksum(repo_root: Path) -> None:
    downloads = 0
    for path, task in role_tasks(repo_root):
        get_url = task.get("ansible.builtin.get_url")
        if isinstance(get_url, dict) and "key" not in str(get_url.get("dest", "")) and not str(get_url.get("dest", "")).endswith(".asc"):
            downloads += 1
            assert str(get_url.get("checksum", "")).startswith("sha256:"), (path, task["name"])
        unarchive = task.get("ansible.builtin.unarchive")
        if isinstance(unarchive, dict):
            assert "://" not in str(unarchive["src"]) and "_url" not in str(unarchive["src"]), (path, task["name"])
        apt = task.get("ansible.builtin.apt")
        if isinstance(apt, dict) and "deb" in apt:
            assert "_url" not in str(apt["deb"]) and "://" not in str(apt["deb"]), (path, task["name"])
    assert downloads >= 3  # enroot, pyxis, the GPU exporter


def test_every_install_refreshes_the_package_index_first(repo_root: Path) -> None:
    # A task installs only when a package is missing, and then refreshes the index,
    # whatever its age: an interrupted first run converges on the next.
    defaults = yaml.safe_load(repo_root.joinpath(*ANSIBLE_DIR_PARTS, "roles", "common", "defaults", "main.yml").read_text())
    assert defaults["common_apt_cache_valid_time_s"] == 0
    for path, task in role_tasks(repo_root):
        apt = task.get("ansible.builtin.apt")
        if isinstance(apt, dict) and ("name" in apt or "deb" in apt) and apt.get("state", "present") == "present":
            assert apt.get("update_cache") is True, (path, task["name"])
            assert apt.get("cache_valid_time", "{{ common_apt_cache_valid_time_s }}") == "{{ common_apt_cache_valid_time_s }}", (path, task["name"])


def test_the_api_virtualenv_installs_pinned_dependencies(repo_root: Path) -> None:
    release = repo_root.joinpath(*ANSIBLE_DIR_PARTS, "roles", "gpupool_api", "tasks", "release.yml").read_text()
    assert "'--constraint', gpupool_api_home ~ '/releases/' ~ gpupool_api_release ~ '.lock'" in release
    lock = [line for line in (repo_root / "requirements.lock").read_text().splitlines() if line and not line.startswith("#")]
    assert lock and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[^\s=]+", line) for line in lock), lock
    pinned = {line.split("==")[0].lower().replace("_", "-") for line in lock}
    assert {"flask", "gunicorn", "sqlalchemy", "psycopg2-binary", "alembic"} <= pinned


# --- issue 16: the port list, exporters' addresses, tenants everywhere, preflight ------

def admission(rules: str) -> tuple[dict[str, set[str]], list[str]]:
    """From a rendered gpupool.nft: {ports: sources admitted} and the ports dropped for everyone else, in order."""
    chain = rules[rules.index("chain admit_input"):]
    admitted: dict[str, set[str]] = {}
    for ports, sources in re.findall(r"th dport \{ ([^}]*) \} ip6? saddr \{ ([^}]*) \} accept", chain):
        admitted.setdefault(ports, set()).update(source.strip() for source in sources.split(","))
    dropped = re.findall(r"th dport \{ ([^}]*) \} drop", chain)
    return admitted, dropped


def test_firewall_admits_each_service_port_only_from_the_hosts_that_need_it(rendered: Rendered) -> None:
    every_host = {"10.0.0.10", "10.0.0.21", "10.0.0.22"}
    expected = {
        # ctl1: controller, API host, NFS server and Prometheus.
        "ctl1": {
            "6817": every_host,                      # slurmctld: sbatch, srun, every slurmd
            "6819": {"10.0.0.10"},                   # slurmdbd: slurmctld, sacct on the API host (both ctl1)
            "60001-63000": every_host,               # SrunPortRange
            "2049": {"10.0.0.21", "10.0.0.22"},      # NFS: the other clients
            "8000": {"10.0.0.10"},                   # gunicorn: Prometheus
            "9090": {"10.0.0.10"},
            "9100": {"10.0.0.10"},
        },
        "gpu01": {"6818": every_host, "60001-63000": every_host, "9100": {"10.0.0.10"}, "9400": {"10.0.0.10"}},
    }
    # Listed, and admitted from nobody but the host itself (loopback).
    local_only = {"ctl1": {"3306", "5432", "6379", "6820", "111, 20048"}, "gpu01": {"6820"}}
    for host in ("ctl1", "gpu01"):
        rules = rendered.text(host, "etc/gpupool-firewall.nft")
        admitted, dropped = admission(rules)
        assert admitted == expected[host], host
        assert set(dropped) == set(expected[host]) | local_only[host], host
        # Loopback and replies to the host's own connections first; every drop after every accept.
        chain = rules[rules.index("chain admit_input"):]
        assert chain.index('iif "lo" accept') < chain.index("ct state established,related accept") < chain.index(" accept\n        meta")
        assert chain.rindex(" accept\n") < chain.index(" drop\n"), host
        # A GPU node serves no database, NFS or Slurm controller port at all.
        if host == "gpu01":
            assert not {"5432", "6379", "2049", "6817", "6819"} & set(dropped)
        if shutil.which("nft"):
            subprocess.run(["nft", "-c", "-f", str(rendered.path(host, "etc/gpupool-firewall.nft"))], check=True, timeout=30, capture_output=True)


def test_two_database_hosts_give_one_database_for_every_api_host_a_backup_controller_and_their_ports(
        repo_root: Path, tmp_path: Path) -> None:
    """Issue 36: ctl2 a second controller, API host and database member; etcd on ctl1, ctl2 and gpu01."""
    inventory = example_copy(repo_root, tmp_path)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    children = hosts["all"]["children"]
    children["controller"]["hosts"]["ctl2"] = {"ansible_host": "10.0.0.11"}
    children["api"]["hosts"]["ctl2"] = None
    children["database"] = {"hosts": {"ctl1": None, "ctl2": None}}
    children["etcd"] = {"hosts": {"ctl1": None, "ctl2": None, "gpu01": None}}
    children["loadbalancer"] = {"hosts": {"gpu02": None}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    head = {"processor_count": 1, "processor_cores": 4, "processor_threads_per_core": 2, "memtotal_mb": 32000}
    facts = {"ctl1": head, "ctl2": head,
             "gpu01": {"processor_count": 2, "processor_cores": 16, "processor_threads_per_core": 2, "memtotal_mb": 257000},
             "gpu02": {"processor_count": 1, "processor_cores": 12, "processor_threads_per_core": 2, "memtotal_mb": 128000}}
    out = tmp_path / "out"
    ansible_dir = repo_root / "deploy" / "ansible"
    run_playbook(ansible_dir, str(inventory), "tests/render.yml",
                 *render_arguments(ansible_dir, out, "--tags", "slurm,api,firewall", "-e", json.dumps({"render_facts": facts})))

    # Slurm's backup controller: both named, the state where both see it, one slurm.conf everywhere.
    conf = config_lines((out / "ctl1" / "etc/slurm/slurm.conf").read_text())
    assert [line for line in conf if line.startswith("SlurmctldHost=")] == ["SlurmctldHost=ctl1(10.0.0.10)", "SlurmctldHost=ctl2(10.0.0.11)"]
    assert f"StateSaveLocation={out}/shared/srv/gpupool/slurmctld-state" in conf and "SlurmctldTimeout=30" in conf
    assert all((out / host / "etc/slurm/slurm.conf").read_text() == (out / "ctl1" / "etc/slurm/slurm.conf").read_text()
               for host in ("ctl2", "gpu01", "gpu02"))

    # Every API host's every connection: libpq's host list, whichever host leads.
    hosts_query = "host=10.0.0.10:5432&host=10.0.0.11:5432&target_session_attrs=read-write"
    for host in ("ctl1", "ctl2"):
        credentials = out / host / "etc/gpupool/credentials"
        assert (credentials / "api" / "database_url").read_text() == f"postgresql://gpupool_api:render-api-password@/gpupool?{hosts_query}"
        assert (credentials / "billing" / "billing_database_url").read_text().endswith(f"@/gpupool?{hosts_query}")
        operator = dict(line.split("=", 1) for line in config_lines((out / host / "etc/gpupool/operator.env").read_text()))
        assert operator["GPUPOOL_DATABASE_URL"].strip('"').endswith(f"@/gpupool?{hosts_query}")
        # A failover costs no request a 503: each worker pings its pooled connection first.
        assert 'GPUPOOL_DATABASE_PRE_PING="true"' in config_lines((out / host / "etc/gpupool/gpupool.env").read_text())
    # psycopg2 gets one comma-separated host list from it, as libpq wants.
    url = sqlalchemy.make_url(normalize_url((out / "ctl1" / "etc/gpupool/credentials/api/database_url").read_text()))
    _, connect = url.get_dialect()().create_connect_args(url)
    assert (connect["host"], connect["port"], connect["target_session_attrs"]) == ("10.0.0.10,10.0.0.11", "5432,5432", "read-write")
    # Each database host dumps its own member nightly, under Patroni (no Debian cluster unit to need).
    for host in ("ctl1", "ctl2"):
        backup = unit_settings((out / host / "etc/systemd/system/gpupool-backup.service").read_text())["Unit"]
        assert (backup["Requires"], backup["After"]) == (["patroni.service"], ["patroni.service"])

    # PostgreSQL, Patroni and etcd admit the hosts that need them and no one else.
    heads, members = {"10.0.0.10", "10.0.0.11"}, {"10.0.0.10", "10.0.0.11", "10.0.0.21"}
    admitted, dropped = admission((out / "ctl1" / "etc/gpupool-firewall.nft").read_text())
    assert (admitted["5432"], admitted["8008"], admitted["2379, 2380"]) == (heads, heads, members)
    admitted, dropped = admission((out / "gpu01" / "etc/gpupool-firewall.nft").read_text())
    assert admitted["2379, 2380"] == members and "5432" not in dropped and "8008" not in dropped
    admitted, dropped = admission((out / "gpu02" / "etc/gpupool-firewall.nft").read_text())
    assert not {"5432", "8008", "2379, 2380"} & set(dropped)

    # HAProxy on gpu02 names each customer's address to the API hosts' nginx (PROXY protocol), which believes
    # it from gpu02 alone, on a port that takes gpu02's connections and nobody else's.
    for host in ("ctl1", "ctl2"):
        site = config_lines((out / host / "etc/nginx/sites-available/gpupool").read_text())
        directives = [line.strip() for line in site]
        assert {"listen 8443 ssl http2 proxy_protocol;", "listen [::]:8443 ssl http2 proxy_protocol;",
                "set_real_ip_from 10.0.0.22;", "real_ip_header proxy_protocol;"} <= set(directives), directives
        assert [line for line in directives if line.startswith("set_real_ip_from")] == ["set_real_ip_from 10.0.0.22;"]
        admitted, dropped = admission((out / host / "etc/gpupool-firewall.nft").read_text())
        assert admitted["8443"] == {"10.0.0.22"} and "8443" in dropped
    assert "8443" not in admission((out / "gpu01" / "etc/gpupool-firewall.nft").read_text())[1]


def test_nfs_server_offers_nfsv4_only_with_mountd_on_a_fixed_port(rendered: Rendered) -> None:
    conf = config_lines(rendered.text("ctl1", "etc/nfs.conf.d/gpupool.conf"))
    assert conf == ["[nfsd]", "vers2=n", "vers3=n", "[mountd]", "port=20048"]
    fstab = rendered.text("gpu01", "etc/fstab")
    assert " nfs nfsvers=4.2," in fstab


def example_copy(repo_root: Path, folder: Path) -> Path:
    """inventories/example, copied for a test to change."""
    inventory = folder / "inventory"
    shutil.copytree(repo_root / "deploy" / "ansible" / "inventories" / "example", inventory)
    return inventory


def test_prometheus_scrapes_the_address_the_exporters_listen_on(repo_root: Path, tmp_path: Path) -> None:
    inventory = example_copy(repo_root, tmp_path)
    with (inventory / "host_vars" / "gpu01.yml").open("a") as host_vars:
        host_vars.write("# Its ansible_host is public; metrics stay on the private network.\nmonitoring_listen_address: 192.168.50.21\n")
    out = tmp_path / "out"
    ansible_dir = repo_root / "deploy" / "ansible"
    run_playbook(ansible_dir, str(inventory), RENDER_PLAYBOOK, *render_arguments(ansible_dir, out, "--tags", "monitoring"))
    exporter = unit_settings((out / "gpu01" / "etc/systemd/system/gpu-exporter.service").read_text())["Service"]["ExecStart"]
    assert exporter[0].endswith("--web.listen-address=192.168.50.21:9400")
    config = yaml.safe_load((out / "ctl1" / "etc/prometheus/prometheus.yml").read_text())
    targets = {job["job_name"]: [t for group in job["static_configs"] for t in group["targets"]] for job in config["scrape_configs"]}
    assert targets["gpu"] == ["192.168.50.21:9400", "10.0.0.22:9400"]
    assert set(targets["node"]) == {"10.0.0.10:9100", "192.168.50.21:9100", "10.0.0.22:9100"}


def test_tenants_step_gives_a_separate_controller_and_api_host_every_accounts_user(repo_root: Path, tmp_path: Path) -> None:
    # slurmctld resolves an association's user to a uid on its own host: a
    # controller without the users would reject every job of theirs.
    inventory = example_copy(repo_root, tmp_path)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["api"]["hosts"] = {"api1": {"ansible_host": "10.0.0.11"}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    out = tmp_path / "out"
    ansible_dir = repo_root / "deploy" / "ansible"
    cli = fake_gpupool(tmp_path, TENANT_ACCOUNTS)
    run_playbook(ansible_dir, str(inventory), "tests/render.yml",
                 *render_arguments(ansible_dir, out, "--tags", "tenants", "-e", f"tenants_cli={cli}", "-e", "tenants_from_api=true"))
    for host in ("ctl1", "api1", "gpu01", "gpu02"):
        assert json.loads((out / f"{host}-tenants.json").read_text()) == TENANT_ACCOUNTS[:2], host


PREFLIGHT_PLAY = """
- name: Preflight alone
  hosts: controller:compute:api
  tasks:
    - name: Check everything that can be checked before a change
      ansible.builtin.import_role:
        name: preflight
    - name: Change something
      ansible.builtin.copy:
        content: changed
        dest: "{{ marker_dir }}/{{ inventory_hostname }}"
        mode: "0644"
"""


def preflight_run(repo_root: Path, folder: Path, hosts: dict[str, object], *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The preflight role on this machine for an inventory of local hosts, then a task that would change something."""
    ansible_dir = repo_root / "deploy" / "ansible"
    inventory = folder / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                 "gpu_mode": "emulated", "shared_storage_enabled": False, "monitoring_enabled": False},
        "children": hosts}}))
    playbook = folder / "preflight.yml"
    playbook.write_text(PREFLIGHT_PLAY)
    markers = folder / "changed"
    markers.mkdir()
    completed = subprocess.run(
        [str(venv_tool("ansible-playbook")), "-i", str(inventory), str(playbook), "-e", f"marker_dir={markers}", *extra],
        cwd=ansible_dir, env=ansible_env(ansible_dir), capture_output=True, text=True, timeout=300, check=False,
    )
    return completed, markers


def test_preflight_refuses_two_hosts_of_one_name_and_changes_nothing(repo_root: Path, tmp_path: Path) -> None:
    # Two inventory entries for this one machine: the facts give both its host name.
    hosts = {"controller": {"hosts": {"ctl1": {"ansible_host": "10.0.0.10"}}},
             "api": {"hosts": {"ctl1": None}},
             "compute": {"hosts": {"gpu01": {"ansible_host": "10.0.0.21"}}}}
    completed, markers = preflight_run(repo_root, tmp_path, hosts, "-e", "container_runtime_enabled=false")
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, output
    name = socket.gethostname().lower()
    assert f"host name {name} of ctl1 and gpu01" in output, output
    # Found once, on the first host; the play stops on every host: nothing is changed anywhere.
    assert list(markers.iterdir()) == [], output


def test_preflight_refuses_two_hosts_of_one_address(repo_root: Path, tmp_path: Path) -> None:
    hosts = {"controller": {"hosts": {"ctl1": {"ansible_host": "10.0.0.10", "slurm_node_name": "c1"}}},
             "api": {"hosts": {"ctl1": None}},
             "compute": {"hosts": {"gpu01": {"ansible_host": "10.0.0.10", "slurm_node_name": "g1"}}}}
    completed, _ = preflight_run(repo_root, tmp_path, hosts, "-e", "container_runtime_enabled=false")
    assert completed.returncode != 0
    assert "address 10.0.0.10 of ctl1 and gpu01" in completed.stdout


def test_preflight_stops_every_host_on_a_bad_checksum_before_any_change(repo_root: Path, tmp_path: Path) -> None:
    # One host (this machine), as controller, API host and compute node: the
    # unique-names check passes, the download's checksum does not.
    tarball = tmp_path / "pyxis.tar.gz"
    tarball.write_bytes(b"not the release\n")
    downloads = tmp_path / "downloads"
    hosts = {group: {"hosts": {"localhost": None}} for group in ("controller", "api", "compute")}
    common = ["-e", "container_runtime_enroot=false", "-e", f"container_runtime_pyxis_url=file://{tarball}",
              "-e", f"container_runtime_download_dir={downloads}"]
    (tmp_path / "bad").mkdir()
    completed, markers = preflight_run(repo_root, tmp_path / "bad", hosts, *common, "-e", f"container_runtime_pyxis_sha256={'0' * 64}")
    assert completed.returncode != 0
    assert "did not match" in completed.stdout and f"file://{tarball}" in completed.stdout, completed.stdout
    assert list(markers.iterdir()) == [] and not list(downloads.glob("pyxis-*"))
    # The right checksum: fetched once into the container runtime's cache, then left alone.
    right = hashlib.sha256(tarball.read_bytes()).hexdigest()
    for attempt in ("first", "second"):
        (tmp_path / attempt).mkdir()
        completed, markers = preflight_run(repo_root, tmp_path / attempt, hosts, *common, "-e", f"container_runtime_pyxis_sha256={right}")
        assert completed.returncode == 0, completed.stdout
        assert [path.name for path in markers.iterdir()] == ["localhost"]
    assert (downloads / "pyxis-0.20.0.tar.gz").read_bytes() == tarball.read_bytes()
    assert "changed: [localhost] => (item=file://" not in completed.stdout, completed.stdout


def test_a_forgotten_inventory_provisions_no_host(repo_root: Path) -> None:
    ansible_dir = repo_root / "deploy" / "ansible"
    completed = subprocess.run(
        [str(venv_tool("ansible-playbook")), "site.yml", "--list-hosts"],
        cwd=ansible_dir, env=ansible_env(ansible_dir), capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert re.findall(r"hosts \((\d+)\)", completed.stdout) and set(re.findall(r"hosts \((\d+)\)", completed.stdout)) == {"0"}, completed.stdout


def test_operator_guide_port_list_names_every_port_of_the_firewall(repo_root: Path) -> None:
    defaults = yaml.safe_load(repo_root.joinpath(*ANSIBLE_DIR_PARTS, "roles", "firewall", "defaults", "main.yml").read_text())
    guide = (repo_root / "docs" / "operator-guide.md").read_text()
    section = guide[guide.index("## Ports and the host firewall"):]
    section = section[:section.index("\n## ", 4)]
    for entry in defaults["firewall_port_list"]:
        assert f"| {entry['service']} |" in section, entry["service"]


# --- first install, reboots and the driver (issue 16) --------------------------------------


def node_lines(out: Path, host: str = "ctl1") -> list[str]:
    return [line for line in config_lines((out / host / "etc" / "slurm" / "slurm.conf").read_text()) if line.startswith("NodeName=")]


def test_nodes_waiting_for_their_reboot_get_node_lines_from_the_inventory(repo_root: Path, tmp_path: Path) -> None:
    # A first install with reboots disallowed: no driver is loaded on either GPU box, so nothing can be discovered.
    run = render(repo_root.joinpath(*ANSIBLE_DIR_PARTS), tmp_path, *SLURM_FILES, "-e", json.dumps({"render_reboot_pending_hosts": ["gpu01", "gpu02"]}))
    assert run.changed["ctl1"] > 0
    assert node_lines(tmp_path) == [
        "NodeName=gpu01 NodeAddr=10.0.0.21 CPUs=64 Sockets=2 CoresPerSocket=16 ThreadsPerCore=2 RealMemory=231300 Gres=gpu:rtx4090:4 State=UNKNOWN",
        "NodeName=gpu02 NodeAddr=10.0.0.22 CPUs=24 Sockets=1 CoresPerSocket=12 ThreadsPerCore=2 RealMemory=115200 Gres=gpu:rtx3090:2 State=UNKNOWN",
    ]
    assert "gpu02 cannot report its GPUs before its reboot: its node line is written from the inventory (slurm_node_gpus)" in run.output
    settings = config_lines((tmp_path / "ctl1" / "etc" / "slurm" / "slurm.conf").read_text())
    assert "AccountingStorageTRES=gres/gpu,gres/gpu:rtx4090,gres/gpu:rtx3090" in settings
    # slurmd, once the node has rebooted, finds the GPUs slurm.conf promises.
    assert config_lines(rendered_text(tmp_path, "gpu01", "etc/slurm/gres.conf")) == ["NodeName=gpu01 Name=gpu Type=rtx4090 File=/dev/nvidia[0-3]"]
    assert config_lines(rendered_text(tmp_path, "gpu02", "etc/slurm/gres.conf")) == ["NodeName=gpu02 Name=gpu Type=rtx3090 File=/dev/nvidia[0-1]"]


def rendered_text(out: Path, host: str, relative: str) -> str:
    return (out / host / relative).read_text()


def test_a_node_waiting_for_its_reboot_keeps_its_slurm_conf_line_and_gres_conf(rendered: Rendered, repo_root: Path, tmp_path: Path) -> None:
    # A routine rerun while gpu02's new driver waits for its reboot: gpu02 cannot be asked, and nothing changes.
    out = tmp_path / "render"
    shutil.copytree(rendered.root, out, symlinks=True)
    before = {host: rendered_text(out, host, "etc/slurm/slurm.conf") for host in ("ctl1", "gpu01", "gpu02")}
    gres_before = rendered_text(out, "gpu02", "etc/slurm/gres.conf")
    job_submit_before = rendered_text(out, "ctl1", "etc/slurm/job_submit.lua")
    run = render(repo_root.joinpath(*ANSIBLE_DIR_PARTS), out, *SLURM_FILES, "-e", json.dumps({"render_reboot_pending_hosts": ["gpu02"]}))
    assert "gpu02 cannot report its GPUs before its reboot: its node line stays as the controller has it" in run.output
    # (Files naming the render folder change with the copy; these name none.)
    assert {host: rendered_text(out, host, "etc/slurm/slurm.conf") for host in before} == before
    assert rendered_text(out, "gpu02", "etc/slurm/gres.conf") == gres_before
    assert rendered_text(out, "ctl1", "etc/slurm/job_submit.lua") == job_submit_before


def test_an_unreachable_node_the_inventory_describes_fully_gets_its_node_line(repo_root: Path, tmp_path: Path) -> None:
    output = render_refused(
        repo_root.joinpath(*ANSIBLE_DIR_PARTS), tmp_path, *SLURM_FILES,
        "-e", json.dumps({"render_fail_hosts": ["gpu02"], "slurm_node_cpus": 24, "slurm_node_real_memory": 115200}),
    )
    assert "gpu02 is unreachable or failed earlier in this run (see the recap): its node line is written from the inventory" in output
    assert node_lines(tmp_path) == [
        "NodeName=gpu01 NodeAddr=10.0.0.21 CPUs=24 RealMemory=115200 Gres=gpu:rtx4090:4 State=UNKNOWN",
        "NodeName=gpu02 NodeAddr=10.0.0.22 CPUs=24 RealMemory=115200 Gres=gpu:rtx3090:2 State=UNKNOWN",
    ]


def test_slurm_conf_sets_the_srun_port_range_the_firewall_opens(rendered: Rendered) -> None:
    assert "SrunPortRange=60001-63000" in config_lines(rendered.text("ctl1", "etc/slurm/slurm.conf"))


def test_slurmd_waits_for_the_persistence_daemon_and_every_gpu_device(rendered: Rendered, tmp_path: Path) -> None:
    unit = unit_settings(rendered.text("gpu01", "etc/systemd/system/slurmd.service.d/gpupool.conf"))
    assert unit["Unit"]["After"] == ["nvidia-persistenced.service"]
    assert unit["Unit"]["Requires"] == ["nvidia-persistenced.service"]
    assert unit["Service"]["Restart"] == ["on-failure"]
    assert int(unit["Service"]["RestartSec"][0]) > 0
    (check,) = unit["Service"]["ExecStartPre"]
    argv = shlex.split(check)
    assert argv[1:] == ["--gres-conf", str(rendered.path("gpu01", "etc/slurm/gres.conf")), "--node-name", "gpu01"]
    # The check itself, on gpu01's gres.conf with its /dev/nvidiaN moved here, and a line of another node.
    devices = tmp_path / "dev"
    devices.mkdir()
    gres_conf = tmp_path / "gres.conf"
    gres_conf.write_text(
        rendered.text("gpu01", "etc/slurm/gres.conf").replace("/dev/nvidia", f"{devices}/nvidia")
        + f"NodeName=gpu02 Name=gpu Type=rtx3090 File={devices}/other[0-1]\n"
    )
    command = [argv[0], "--gres-conf", str(gres_conf), "--node-name", "gpu01"]
    for index in range(3):
        (devices / f"nvidia{index}").touch()
    missing = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"slurm-gres-devices: {devices}/nvidia3 (named in {gres_conf}) does not exist yet"
    (devices / "nvidia3").touch()
    present = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert (present.returncode, present.stderr) == (0, "")


def test_slurmd_device_check_reads_slurms_ranges(rendered: Rendered, tmp_path: Path) -> None:
    gres_conf = tmp_path / "gres.conf"
    gres_conf.write_text(f"Name=gpu Type=a File={tmp_path}/gpu[0,2-3]\n")
    command = [str(rendered.path("gpu01", "usr/local/sbin/slurm-gres-devices")), "--gres-conf", str(gres_conf), "--node-name", "gpu01"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 1
    assert [line.split()[1] for line in result.stderr.splitlines()] == [f"{tmp_path}/gpu{n}" for n in (0, 2, 3)]
    gres_conf.unlink()
    unreadable = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert unreadable.returncode == 2 and "cannot read" in unreadable.stderr


def test_driver_packages_are_held_and_kept_out_of_unattended_upgrades(repo_root: Path, tmp_path: Path) -> None:
    render(repo_root.joinpath(*ANSIBLE_DIR_PARTS), tmp_path, "--tags", "driver,driver_hold")
    assert json.loads((tmp_path / "gpu01-held.json").read_text()) == [
        "libnvidia-compute-535-server",
        "linux-modules-nvidia-535-server-6.8.0-45-generic",
        "linux-modules-nvidia-535-server-generic-hwe-22.04",
        "nvidia-compute-utils-535-server",
        "nvidia-dkms-535-server",
        "nvidia-firmware-535-server-535.183.01",
        "nvidia-headless-535-server",
        "nvidia-kernel-common-535-server",
    ]  # nvidia-utils-535-server is held already
    assert json.loads((tmp_path / "gpu02-held.json").read_text()) == []
    blacklist = (tmp_path / "gpu01" / "etc" / "apt" / "apt.conf.d" / "51gpupool-nvidia-driver").read_text()
    patterns = re.findall(r'^\s*"([^"]+)";$', blacklist, re.MULTILINE)
    assert "Unattended-Upgrade::Package-Blacklist {" in blacklist and patterns
    # unattended-upgrades matches these as Python regular expressions.
    def blocked(package: str) -> bool:
        return any(re.match(pattern, package) for pattern in patterns)
    assert all(blocked(name) for name in ("nvidia-utils-535-server", "libnvidia-compute-535-server", "linux-modules-nvidia-535-server-generic"))
    assert not any(blocked(name) for name in ("nvidia-container-toolkit", "libnvidia-container1", "openssh-server"))


def test_compute_nodes_reboot_in_a_rolling_play_between_the_driver_and_slurm(repo_root: Path) -> None:
    ansible_dir = repo_root.joinpath(*ANSIBLE_DIR_PARTS)
    plays = yaml.safe_load((ansible_dir / "site.yml").read_text())

    def imports(play: dict[str, object]) -> list[tuple[str, str]]:
        return [(task["ansible.builtin.import_role"]["name"], task["ansible.builtin.import_role"].get("tasks_from", "main"))
                for task in play["tasks"] if "ansible.builtin.import_role" in task]  # type: ignore[index,union-attr]

    (rolling,) = [play for play in plays if ("common", "rolling_reboot") in imports(play)]
    assert rolling["hosts"] == "compute"
    assert rolling["serial"] == "{{ gpupool_reboot_serial | default(1) }}"
    assert rolling["max_fail_percentage"] == 0
    order = plays.index(rolling)
    assert any(("nvidia_driver", "main") in imports(play) for play in plays[:order])
    assert any(("slurm_common", "main") in imports(play) for play in plays[order + 1:])
    # Drained with gpupool's reason, idle or given back, rebooted, registered again, resumed: in that order.
    tasks = yaml.safe_load((ansible_dir / "roles" / "common" / "tasks" / "rolling_reboot.yml").read_text())[0]["block"]
    names = [task["name"] for task in tasks]
    steps = ["Drain the node for its reboot", "Wait until no job runs on the node", "Give the node back to its jobs without the reboot",
             "Reboot once for the driver and the boot options", "Wait until slurmd registers again",
             "Return the node to service after its reboot"]
    assert [names.index(step) for step in steps] == sorted(names.index(step) for step in steps)
    drain = tasks[names.index("Drain the node for its reboot")]["ansible.builtin.command"]["argv"]
    assert drain[:4] == ["scontrol", "update", "nodename={{ common_reboot_node_name }}", "state=drain"]
    assert drain[4].startswith("reason=gpupool: reboot for ")


# --- issue 35: the GPU health check ------------------------------------------------------


def test_gpu_nodes_run_the_gpu_health_check_with_the_operators_interval_and_thresholds(repo_root: Path, tmp_path: Path) -> None:
    render(
        repo_root / "deploy" / "ansible", tmp_path, *SLURM_FILES,
        "-e", "slurm_common_health_check_interval_s=120", "-e", "slurm_compute_gpu_check_temperature_drain_c=90",
    )
    settings = config_lines((tmp_path / "ctl1" / "etc" / "slurm" / "slurm.conf").read_text())
    check_config = json.loads((tmp_path / "gpu01" / "etc" / "slurm" / "gpupool-gpu-check.json").read_text())
    launcher = tmp_path / "gpu01" / "usr" / "local" / "sbin" / "gpupool-gpu-check"

    assert {"HealthCheckProgram=/usr/local/sbin/gpupool-gpu-check", "HealthCheckInterval=120",
            "HealthCheckNodeState=ANY"} <= set(settings)
    assert check_config["node_name"] == "gpu01"
    assert check_config["gres_conf"] == str(tmp_path / "gpu01" / "etc" / "slurm" / "gres.conf")
    assert (check_config["temperature_warn_c"], check_config["temperature_drain_c"]) == (85.0, 90.0)
    assert check_config["drain"] is True
    # Jobs on a failed GPU: ended, spot ones requeued, with Slurm's own commands beside scontrol.
    assert (check_config["end_jobs"], check_config["requeue_qos"]) == (True, "spot")
    assert (check_config["squeue"], check_config["scancel"]) == ("/usr/bin/squeue", "/usr/bin/scancel")
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o755 and launcher.stat().st_uid == 0
    # The copied modules run on their own under the system's python3: gpu01's four RTX 4090s are
    # not on this machine, so the check would drain it for the first missing device file.
    completed = subprocess.run(
        [str(launcher), "--dry-run"], capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert completed.returncode == 1, completed.stderr
    assert "gpu01: would drain: gpu: /dev/nvidia0 missing (gres.conf names it)" in completed.stderr


def test_the_health_check_can_be_left_out_of_slurm_conf(repo_root: Path, tmp_path: Path) -> None:
    render(repo_root / "deploy" / "ansible", tmp_path, *SLURM_FILES, "-e", "slurm_common_health_check_program=")
    settings = config_lines((tmp_path / "ctl1" / "etc" / "slurm" / "slurm.conf").read_text())

    assert not [line for line in settings if line.startswith("HealthCheck")]
    assert not (tmp_path / "gpu01" / "usr" / "local" / "sbin" / "gpupool-gpu-check").exists()
