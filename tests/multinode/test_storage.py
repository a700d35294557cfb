"""An account's storage on a cluster of two GPU nodes: written by a job on one node, read by a job on the other.

Each account's volume is mounted once, on the host that holds the storage, and
every node sees it at the same path (in production through the NFS export's
``crossmnt``; here the namespaces share this machine's mounts). What is checked
is what a customer relies on: ``$GPUPOOL_DATA`` names the same files on every
node, a job on either node writes them as the account's user, and the API
serves what the other node's job wrote.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from bench.support.storage import account_volumes, storage_root_for_tests
from bench.support.tenancy import runas_helper
from gpupool.config import Settings
from tests.conftest import wait_for_state
from tests.multinode.conftest import GPU2_NODE, GPU4_NODE, MULTINODE_SLURM_CONF, sacct_runs

pytestmark = [pytest.mark.multinode, pytest.mark.slow]

QUOTA = 16 * 1024 * 1024


@pytest.fixture(scope="module")
def storage_root() -> Iterator[Path]:
    with storage_root_for_tests() as root:
        yield root


@pytest.fixture(scope="module")
def storage_socket(job_root: Path, storage_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A run-as helper that knows the storage root and submits to the multinode cluster."""
    extra = {"GPUPOOL_STORAGE_ROOT": str(storage_root), "SLURM_CONF": MULTINODE_SLURM_CONF}
    with runas_helper(job_root, tmp_path_factory.mktemp("mn-storage-runas"), extra) as socket_path:
        yield socket_path


@pytest.fixture(scope="module")
def volume(session_settings: Settings, storage_root: Path, slurm_account: str, pg_url: str) -> Iterator[str]:
    with account_volumes(session_settings.replace(storage_root=str(storage_root)), pg_url, [slurm_account], QUOTA):
        yield slurm_account


@pytest.fixture
def settings(session_settings: Settings, storage_root: Path, storage_socket: str, volume: str) -> Settings:
    return session_settings.replace(storage_root=str(storage_root), runas_socket=storage_socket)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_on(client: FlaskClient, auth: dict[str, str], gpu_type: str, node: str, command: str) -> None:
    """A `command` job routed to ``node`` by its GPU type, ended COMPLETED there by Slurm's own account."""
    response = client.post("/submit", headers=auth, json={
        "template": "command", "gpus": 1, "gpu_type": gpu_type, "params": {"command": command}})
    assert response.status_code == 201, response.get_json()
    job = response.get_json()
    done = wait_for_state(client, job["job_id"], auth, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout_s=120)
    log = client.get(f"/jobs/{job['job_id']}/logs", headers=auth).get_data(as_text=True)
    assert (done["state"], done["node"]) == ("COMPLETED", node), log
    (run,) = sacct_runs(job["slurm_job_id"])
    assert (run["State"], run["NodeList"]) == ("COMPLETED", node)


def test_what_a_job_writes_on_one_node_a_job_on_the_other_reads_and_the_api_serves(
    client: FlaskClient, auth: dict[str, str], account: str,
) -> None:
    data = os.urandom(300_000)
    uploaded = client.put("/files/in/input.bin", headers=auth, data=data)
    assert uploaded.status_code == 201, uploaded.get_json()

    run_on(client, auth, "rtx4090", GPU4_NODE, (
        'set -e\n'
        'sha256sum "$GPUPOOL_DATA/in/input.bin" | cut -d" " -f1 > "$GPUPOOL_DATA/seen-on-gpu1.txt"\n'
        'head -c 65536 /dev/urandom > "$GPUPOOL_DATA/from-gpu1.bin"\n'
        'hostname > "$GPUPOOL_DATA/host1.txt"\n'
    ))
    run_on(client, auth, "rtx3090", GPU2_NODE, (
        'set -e\n'
        'sha256sum "$GPUPOOL_DATA/from-gpu1.bin" | cut -d" " -f1 > "$GPUPOOL_DATA/seen-on-gpu2.txt"\n'
        'hostname > "$GPUPOOL_DATA/host2.txt"\n'
    ))

    def get(path: str) -> bytes:
        response = client.get(f"/files/{path}", headers=auth)
        assert response.status_code == 200, (path, response.status_code, response.get_data()[:500])
        return response.get_data()

    assert get("seen-on-gpu1.txt").decode().strip() == sha(data)
    assert get("seen-on-gpu2.txt").decode().strip() == sha(get("from-gpu1.bin"))
    assert (get("host1.txt").decode().strip(), get("host2.txt").decode().strip()) == (GPU4_NODE, GPU2_NODE)
    listing = client.get("/files/", headers=auth).get_json()
    assert {entry["name"] for entry in listing["entries"]} >= {"in", "from-gpu1.bin", "seen-on-gpu1.txt", "seen-on-gpu2.txt"}
