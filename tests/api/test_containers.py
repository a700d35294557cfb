"""The docker runtime is refused: it needs the tenant in the docker group, which is root on the node."""

from __future__ import annotations

from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from gpupool.config import Settings
from gpupool.slurm.client import SlurmClient
from tests.conftest import bearer, create_app_for_tests, slurm_cmd

IMAGE = "nvcr.io#nvidia/pytorch:24.01-py3"
HELLO_IN_A_CONTAINER = {"template": "hello", "gpus": 1, "params": {"message": "hi", "seconds": 0}, "container_image": IMAGE}


def docker_client(settings: Settings, slurm: SlurmClient, session_factory: sessionmaker) -> tuple[Settings, FlaskClient]:
    docker = settings.replace(container_runtime="docker", container_allowlist=("nvcr.io#nvidia/*",))
    return docker, create_app_for_tests(docker, slurm, session_factory).test_client()


def test_docker_containers_are_refused_even_for_a_single_account(
    settings: Settings, slurm: SlurmClient, session_factory: sessionmaker, account: str
) -> None:
    docker, client = docker_client(settings, slurm, session_factory)
    response = client.post("/submit", headers=bearer(docker, account), json=HELLO_IN_A_CONTAINER)
    assert response.status_code == 422, response.get_data(as_text=True)
    body = response.get_json()
    assert body["error"] == "container_runtime_unsafe"
    assert "root on the node" in body["message"] and "pyxis" in body["message"]
    assert slurm_cmd("squeue", "-h", f"--account={account}").strip() == ""
    # Jobs without a container never touch docker, and still run.
    plain = {key: value for key, value in HELLO_IN_A_CONTAINER.items() if key != "container_image"}
    assert client.post("/submit", headers=bearer(docker, account), json=plain).status_code == 201
