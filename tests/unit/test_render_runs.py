"""The rendered scripts as bash sees them: valid syntax for every template and
runtime, and the docker runtime handing the body and parameters to the container.

docker is not installed on these machines; a stand-in on PATH records what the
script asks of it, so the test checks the rendered file, not a mock of gpupool.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpupool.render import JobSpec, render
from gpupool.templates import Template

RUNTIMES = ("none", "pyxis", "docker")
PARAMS = {
    "hello": {"message": "a'; echo foo\n$(id)", "seconds": 0},
    "inference": {"model": "meta-llama/Llama-3-8B", "input": "x\n#SBATCH --account=evil"},
    "train": {"data_dir": "/data/set1", "epochs": 2},
}


def spec_for(template: Template, runtime: str, job_dir: str, **changes: object) -> JobSpec:
    fields: dict[str, object] = dict(
        job_id="0d3c5e9a-1111-4222-8333-444455556666",
        account="acme",
        name="n",
        template=template.name,
        body=template.body,
        params=template.validate_params(PARAMS[template.name]),
        gpus=2,
        gpu_type=None,
        cpus=2,
        mem_gb=8,
        time_limit_min=10,
        partition="gpu",
        job_dir=job_dir,
        runtime=runtime,
        container_image=None if runtime == "none" else "nvcr.io#nvidia/pytorch:24.01-py3",
    )
    fields.update(changes)
    return JobSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", sorted(PARAMS))
def test_every_rendering_is_valid_bash(shipped_templates: dict[str, Template], tmp_path: Path, name: str, runtime: str) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render(spec_for(shipped_templates[name], runtime, str(tmp_path))).script)
    checked = subprocess.run(["/bin/bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr


def test_docker_runtime_runs_the_body_inside_the_container(hello: Template, tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    record = tmp_path / "docker"
    record.mkdir()
    docker = fake_bin / "docker"
    docker.write_text(
        "#!/bin/bash\n"
        f'printf "%s\\n" "$@" > {record}/argv\n'
        f"cat > {record}/stdin\n"
        f'printf "%s" "$GPUPOOL_PARAM_MESSAGE" > {record}/message\n'
    )
    docker.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(render(spec_for(hello, "docker", str(tmp_path))).script)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "1,3", "SLURM_GPUS_ON_NODE": "2"}
    subprocess.run(["/bin/bash", str(script)], env=env, check=True, timeout=30)

    argv = (record / "argv").read_text().splitlines()
    assert argv[argv.index("--gpus") + 1] == '"device=1,3"'  # only the GPUs Slurm allocated
    assert argv[-3:] == ["nvcr.io#nvidia/pytorch:24.01-py3", "/bin/bash", "-s"]
    passed = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--env"}
    assert {"GPUPOOL_PARAM_MESSAGE", "GPUPOOL_PARAM_SECONDS", "SLURM_GPUS_ON_NODE"} <= passed
    assert "CUDA_VISIBLE_DEVICES" not in passed  # renumbered from 0 inside the container
    assert (record / "stdin").read_text() == "set -euo pipefail\n" + hello.body
    assert (record / "message").read_text() == PARAMS["hello"]["message"]


def test_docker_runtime_refuses_to_run_without_allocated_gpus(hello: Template, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render(spec_for(hello, "docker", str(tmp_path))).script)
    result = subprocess.run(
        ["/bin/bash", str(script)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False, timeout=30
    )
    assert result.returncode != 0
    assert "no GPUs allocated" in result.stderr
