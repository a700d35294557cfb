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
import json
import os
import pwd
import re
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cluster.ansible_run import PlaybookRun, run_playbook

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


def render(ansible_dir: Path, out: Path, *extra: str) -> PlaybookRun:
    controller_key = out / "ctl1" / "etc" / "munge" / "munge.key"
    if not controller_key.exists():
        controller_key.parent.mkdir(parents=True)
        controller_key.write_bytes(os.urandom(1024))
    return run_playbook(
        ansible_dir,
        "example",
        "tests/render.yml",
        "-e",
        f"render_dir={out}",
        "-e",
        f"render_fixtures={ansible_dir / 'tests' / 'fixtures'}",
        *extra,
    )


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
    first = render(ansible_dir, out)
    second = render(ansible_dir, out)
    yield Rendered(out, munge_key, first, second)


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
    assert settings["AccountingStorageEnforce"] == "associations,limits,safe"
    assert settings["AccountingStorageType"] == "accounting_storage/slurmdbd"


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
    assert settings["preload_app"] is False


def test_billing_runs_every_five_minutes_as_the_service_user(rendered: Rendered) -> None:
    service = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-billing.service"))["Service"]
    assert service["Type"] == ["oneshot"]
    assert service["User"] == ["gpupool"] and service["Group"] == ["gpupool"]
    assert service["ExecStart"] == ["/opt/gpupool/venv/bin/gpupool billing run"]
    timer = unit_settings(rendered.text("ctl1", "etc/systemd/system/gpupool-billing.timer"))
    assert timer["Timer"]["OnCalendar"] == ["*:0/5"]
    assert timer["Timer"]["Persistent"] == ["true"]
    assert timer["Timer"]["Unit"] == ["gpupool-billing.service"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]
    assert not rendered.path("ctl1", "etc/cron.d/gpupool-billing").exists()


def test_no_unit_runs_as_root(rendered: Rendered) -> None:
    for unit in ("gpupool-api.service", "gpupool-billing.service"):
        text = rendered.text("ctl1", f"etc/systemd/system/{unit}")
        assert not re.search(r"^(User|Group)=(root|0)\s*$", text, re.MULTILINE), unit
        assert unit_settings(text)["Service"]["NoNewPrivileges"] == ["yes"], unit


def test_environment_file_is_private_and_has_the_settings(rendered: Rendered) -> None:
    env_file = rendered.path("ctl1", "etc/gpupool/gpupool.env")
    info = env_file.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 0
    env = dict(line.split("=", 1) for line in config_lines(env_file.read_text()))
    assert env["GPUPOOL_JWT_SECRET"] == '"render-secret-not-for-use"'
    assert env["GPUPOOL_DATABASE_URL"] == '"postgresql://gpupool@/gpupool?host=/var/run/postgresql"'
    assert env["GPUPOOL_RATELIMIT_STORAGE_URI"] == '"redis://127.0.0.1:6379/0"'
    assert env["GPUPOOL_SLURM_USER"] == '"gpupool"'
    assert env["GPUPOOL_CONTAINER_RUNTIME"] == '"pyxis"'


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


def test_gpupool_wrapper_is_valid_sh_and_drops_to_the_service_user(rendered: Rendered) -> None:
    wrapper = rendered.path("ctl1", "usr/local/sbin/gpupool")
    subprocess.run(["sh", "-n", str(wrapper)], timeout=10, check=True)
    assert "exec runuser -u gpupool -- /opt/gpupool/venv/bin/gpupool \"$@\"" in wrapper.read_text()


def test_nginx_terminates_tls_and_hides_metrics(rendered: Rendered) -> None:
    site = rendered.text("ctl1", "etc/nginx/sites-available/gpupool")
    assert "listen 443 ssl" in site
    assert "ssl_certificate /etc/letsencrypt/live/gpupool.example.com/fullchain.pem;" in site
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
    render(repo_root / "deploy" / "ansible", tmp_path, "-e", "gpupool_api_billing_scheduler=cron")
    cron = config_lines((tmp_path / "ctl1" / "etc" / "cron.d" / "gpupool-billing").read_text())
    wrapper = tmp_path / "ctl1" / "usr" / "local" / "sbin" / "gpupool"
    assert cron[-1] == f"*/5 * * * * root flock --nonblock /run/lock/gpupool-billing.lock {wrapper} billing run"
