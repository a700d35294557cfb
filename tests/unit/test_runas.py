"""The run-as helper's checks on what the service asks it to submit, and tag ownership."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from gpupool.config import Settings
from gpupool.errors import RunasUnavailable, SubmissionUncertain, TenantError
from gpupool.render import JobSpec, render
from gpupool.runas import RunasClient, check_submit_options
from gpupool.slurm import QueueEntry, SlurmClient
from gpupool.tenants import tenant_user_name

JOB_ID = "0b0e4c8e-8a8f-4a2b-9a59-0f6b3c1d2e4f"
JOB_DIR = Path("/var/lib/gpupool/jobs/acme") / JOB_ID


def rendered_options(runtime: str = "none") -> list[str]:
    spec = JobSpec(
        job_id=JOB_ID, account="acme", name="a'; echo foo", template="hello", body="echo hi", params={},
        gpus=1, gpu_type="rtx4090", cpus=2, mem_gb=8, time_limit_min=30, partition="gpu", job_dir=str(JOB_DIR),
        runtime=runtime, container_image="nvcr.io/nvidia/pytorch:24.05-py3" if runtime == "pyxis" else None,
    )
    return list(render(spec).options)


@pytest.mark.parametrize("runtime", ["none", "pyxis"])
def test_every_option_the_renderer_emits_passes(runtime: str) -> None:
    assert check_submit_options(rendered_options(runtime), "acme", JOB_ID, JOB_DIR) == rendered_options(runtime)


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda opts: [*opts, "--uid=0"], "not one gpupool submits"),
        (lambda opts: [*opts, "--export=ALL,LD_PRELOAD=/tmp/x.so"], "not one gpupool submits"),
        (lambda opts: [*opts, "--wrap=id"], "not one gpupool submits"),
        (lambda opts: [o if not o.startswith("--account=") else "--account=root" for o in opts], "--account=acme"),
        (lambda opts: [o for o in opts if not o.startswith("--account=")], "--account=acme"),
        (lambda opts: [*opts, "--account=acme"], "given twice"),
        (lambda opts: [o if not o.startswith("--output=") else "--output=/etc/cron.d/x" for o in opts], "own folder"),
        (lambda opts: [o if not o.startswith("--chdir=") else f"--chdir={JOB_DIR}/../other" for o in opts], "own folder"),
        (lambda opts: [o if not o.startswith("--comment=") else "--comment=gpupool:other" for o in opts], "own gpupool tag"),
        (lambda opts: [*opts, "--mem=1G\x00--uid=0"], "not one gpupool submits"),
    ],
)
def test_anything_else_is_refused(change: object, refusal: str) -> None:
    with pytest.raises(TenantError, match=refusal):
        check_submit_options(change(rendered_options()), "acme", JOB_ID, JOB_DIR)  # type: ignore[operator]


def test_options_must_be_a_list_of_strings() -> None:
    with pytest.raises(TenantError, match="list of strings"):
        check_submit_options("--account=acme", "acme", JOB_ID, JOB_DIR)  # type: ignore[arg-type]


def entry(user: str, account: str) -> QueueEntry:
    return QueueEntry(1, "PENDING", None, None, None, None, None, f"gpupool:{JOB_ID}", user=user, account=account)


def test_a_tag_counts_only_from_the_accounts_own_tenant() -> None:
    settings = Settings(service_user="gpupool", service_group="gpupool")
    client = SlurmClient(settings, tenants=object())  # type: ignore[arg-type]
    assert client.owns(entry("gp-acme", "acme"), "acme")
    assert not client.owns(entry("gp-evil", "evil"), "acme")  # another tenant forging acme's tag
    assert not client.owns(entry("gp-evil", "acme"), "acme")  # a human with an association on acme
    assert not client.owns(entry("gpupool", "acme"), "acme")  # the service itself


def test_tenant_user_names_fit_useradd() -> None:
    settings = Settings(service_user="gpupool", service_group="gpupool")
    assert tenant_user_name(settings, "acme") == "gp-acme"
    with pytest.raises(TenantError, match="too long"):
        tenant_user_name(settings, "a" * 30)


def test_a_helper_that_takes_a_submit_and_drops_the_connection_leaves_it_uncertain(tmp_path: Path) -> None:
    """The helper may have run sbatch: the API must look for the tag, never free the request."""
    path = str(tmp_path / "runas.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def take_and_drop() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)

    taker = threading.Thread(target=take_and_drop)
    taker.start()
    client = RunasClient(Settings(service_user="gpupool", service_group="gpupool", runas_socket=path))
    with pytest.raises(SubmissionUncertain):
        client.submit("acme", JOB_ID, "#!/bin/bash\n", rendered_options(), timeout_s=2)
    taker.join()
    listener.close()


def test_no_helper_at_all_is_unavailable_and_nothing_was_sent(tmp_path: Path) -> None:
    client = RunasClient(Settings(service_user="gpupool", service_group="gpupool", runas_socket=str(tmp_path / "none.sock")))
    with pytest.raises(RunasUnavailable, match="not answering"):
        client.submit("acme", JOB_ID, "#!/bin/bash\n", rendered_options(), timeout_s=2)
