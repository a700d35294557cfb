"""slurm-gpu-discover: gres.conf, Gres= and JSON from nvidia-smi outputs.

The script is run the way the slurm_compute role runs it, as a program, on the
outputs under fixtures/nvidia-smi (see the README there for what each machine is
and where the formats come from). Its pure functions are loaded from the file
for the name and list tests. The few live-mode tests put a stand-in nvidia-smi
and lscpu (shell scripts printing the same fixtures) on PATH, since this
machine has no GPU; they check what the script runs and how it reads failures.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "deploy/ansible/roles/slurm_compute/files/slurm-gpu-discover"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia-smi"
PROG = "slurm-gpu-discover"

NO_DEVICES_MESSAGE = f"{PROG}: no NVIDIA GPU found (nvidia-smi: No devices were found)\n"
NO_DRIVER_MESSAGE = (
    f"{PROG}: NVIDIA driver not usable (nvidia-smi: NVIDIA-SMI has failed because it couldn't communicate "
    "with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.)\n"
)
REQUIRE_MESSAGE = f"{PROG}: no usable GPU and --require-gpus was given\n"
A100_MIG_WARNING = (
    f"{PROG}: warning: GPU 1 (NVIDIA A100-SXM4-80GB, 00000000:41:00.0) skipped: MIG mode is enabled; "
    "Slurm needs AutoDetect=nvml to schedule MIG instances, or turn MIG off with nvidia-smi -i 1 -mig 0\n"
)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the script as the role does; the timeout only guards the test run."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def recorded(box: str, *, topo: bool = True, minors: bool = True, lscpu: bool = True) -> list[str]:
    """Arguments that read one machine's recorded outputs."""
    directory = FIXTURES / box
    args = ["--query-file", str(directory / "query.csv")]
    for flag, wanted, name in (
        ("--topo-file", topo, "topo.txt"),
        ("--minors-file", minors, "minors.txt"),
        ("--lscpu-file", lscpu, "lscpu.txt"),
    ):
        if wanted and (directory / name).exists():
            args += [flag, str(directory / name)]
    return args


@pytest.fixture(scope="module")
def discover_module() -> ModuleType:
    """The script as a module; its file name has a dash, so it is loaded by path."""
    loader = importlib.machinery.SourceFileLoader("slurm_gpu_discover", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up while the file runs
    loader.exec_module(module)
    return module


def test_installable_as_a_program() -> None:
    assert SCRIPT.read_text().splitlines()[0] == "#!/usr/bin/env python3"
    assert os.access(SCRIPT, os.X_OK)


# --- gres.conf and Gres= per machine -----------------------------------------

GRES_CONF = {
    # Two sockets: the hyperthread ids 32-47 and 48-63 fold onto cores 0-15 and 16-31.
    "rtx4090-x4": [
        "Name=gpu Type=rtx4090 File=/dev/nvidia0 Cores=0-15",
        "Name=gpu Type=rtx4090 File=/dev/nvidia1 Cores=0-15",
        "Name=gpu Type=rtx4090 File=/dev/nvidia2 Cores=16-31",
        "Name=gpu Type=rtx4090 File=/dev/nvidia3 Cores=16-31",
    ],
    # One socket, every GPU on every core: no Cores= at all.
    "rtx3090-x2": [
        "Name=gpu Type=rtx3090 File=/dev/nvidia0",
        "Name=gpu Type=rtx3090 File=/dev/nvidia1",
    ],
    # Minor order, not nvidia-smi's index order: 3090@81, 4090@01, 3090@C1, 4090@41.
    "mixed-4090-3090": [
        "Name=gpu Type=rtx3090 File=/dev/nvidia0",
        "Name=gpu Type=rtx4090 File=/dev/nvidia1",
        "Name=gpu Type=rtx3090 File=/dev/nvidia2",
        "Name=gpu Type=rtx4090 File=/dev/nvidia3",
    ],
    "h100-x8": [f"Name=gpu Type=h100 File=/dev/nvidia{n} Cores=0-55" for n in range(4)]
    + [f"Name=gpu Type=h100 File=/dev/nvidia{n} Cores=56-111" for n in range(4, 8)],
    "h200-x8": [f"Name=gpu Type=h200 File=/dev/nvidia{n} Cores=0-47" for n in range(4)]
    + [f"Name=gpu Type=h200 File=/dev/nvidia{n} Cores=48-95" for n in range(4, 8)],
}


@pytest.mark.parametrize("box", sorted(GRES_CONF))
def test_gres_conf(box: str) -> None:
    result = run(*recorded(box))
    assert (result.returncode, result.stdout.splitlines(), result.stderr) == (0, GRES_CONF[box], "")


@pytest.mark.parametrize(
    ("box", "gres"),
    [
        ("rtx4090-x4", "gpu:rtx4090:4"),
        ("rtx3090-x2", "gpu:rtx3090:2"),
        ("mixed-4090-3090", "gpu:rtx3090:2,gpu:rtx4090:2"),
        ("h100-x8", "gpu:h100:8"),
        ("h200-x8", "gpu:h200:8"),
        ("a100-mig", "gpu:a100:3"),
    ],
)
def test_gres_value(box: str, gres: str) -> None:
    result = run(*recorded(box), "--gres")
    assert (result.returncode, result.stdout) == (0, gres + "\n")


def test_node_name_leads_each_line() -> None:
    result = run(*recorded("rtx4090-x4"), "--node-name", "gpu-01")
    assert result.stdout.splitlines() == [f"NodeName=gpu-01 {line}" for line in GRES_CONF["rtx4090-x4"]]


def test_node_name_must_be_a_node_name() -> None:
    result = run(*recorded("rtx4090-x4"), "--node-name", "gpu01 Name=evil")
    assert result.returncode == 2
    assert "--node-name 'gpu01 Name=evil' is not a Slurm node name" in result.stderr
    assert result.stdout == ""


def test_json_mixed_box() -> None:
    result = run(*recorded("mixed-4090-3090"), "--json", "--node-name", "gpu01")
    assert (result.returncode, result.stderr) == (0, "")

    def gpu(minor: int, index: int, model: str, bus: str) -> dict[str, Any]:
        return {
            "minor": minor,
            "index": index,
            "name": f"NVIDIA GeForce RTX {model}",
            "type": f"rtx{model}",
            "pci_bus_id": f"00000000:{bus}:00.0",
            "memory_mib": 24564 if model == "4090" else 24576,
            "file": f"/dev/nvidia{minor}",
            "cpu_affinity": "0-31",
            "cores": None,
        }

    assert json.loads(result.stdout) == {
        "status": "ok",
        "message": None,
        "gres": "gpu:rtx3090:2,gpu:rtx4090:2",
        "types": [{"type": "rtx3090", "count": 2}, {"type": "rtx4090", "count": 2}],
        "gpus": [gpu(0, 2, "3090", "81"), gpu(1, 0, "4090", "01"), gpu(2, 3, "3090", "C1"), gpu(3, 1, "4090", "41")],
        "skipped": [],
        "gres_conf": [f"NodeName=gpu01 {line}" for line in GRES_CONF["mixed-4090-3090"]],
        "warnings": [],
    }


def test_json_h100_minors_and_affinity() -> None:
    document = json.loads(run(*recorded("h100-x8"), "--json").stdout)
    # minors.txt gives the driver's numbering: 1B->2, 43->0, 52->3, 61->1, 9D->6, C3->4, D1->7, DF->5.
    assert [
        (gpu["file"], gpu["index"], gpu["pci_bus_id"], gpu["cpu_affinity"], gpu["cores"]) for gpu in document["gpus"]
    ] == [
        ("/dev/nvidia0", 1, "00000000:43:00.0", "0-55,112-167", "0-55"),
        ("/dev/nvidia1", 3, "00000000:61:00.0", "0-55,112-167", "0-55"),
        ("/dev/nvidia2", 0, "00000000:1B:00.0", "0-55,112-167", "0-55"),
        ("/dev/nvidia3", 2, "00000000:52:00.0", "0-55,112-167", "0-55"),
        ("/dev/nvidia4", 5, "00000000:C3:00.0", "56-111,168-223", "56-111"),
        ("/dev/nvidia5", 7, "00000000:DF:00.0", "56-111,168-223", "56-111"),
        ("/dev/nvidia6", 4, "00000000:9D:00.0", "56-111,168-223", "56-111"),
        ("/dev/nvidia7", 6, "00000000:D1:00.0", "56-111,168-223", "56-111"),
    ]
    assert {gpu["name"] for gpu in document["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    assert document["types"] == [{"type": "h100", "count": 8}]


# --- MIG -----------------------------------------------------------------------


def test_mig_gpu_is_skipped_with_a_warning() -> None:
    result = run(*recorded("a100-mig"))
    assert (result.returncode, result.stdout.splitlines(), result.stderr) == (
        0,
        [
            "Name=gpu Type=a100 File=/dev/nvidia0 Cores=0-63",
            "Name=gpu Type=a100 File=/dev/nvidia2 Cores=64-127",
            "Name=gpu Type=a100 File=/dev/nvidia3 Cores=64-127",
        ],
        A100_MIG_WARNING,
    )


def test_mig_gpu_in_json() -> None:
    document = json.loads(run(*recorded("a100-mig"), "--json").stdout)
    assert document["skipped"] == [
        {
            "index": 1,
            "minor": 1,
            "name": "NVIDIA A100-SXM4-80GB",
            "pci_bus_id": "00000000:41:00.0",
            "reason": "MIG mode is enabled",
        }
    ]
    assert [gpu["index"] for gpu in document["gpus"]] == [0, 2, 3]
    assert document["warnings"] == [A100_MIG_WARNING.removeprefix(f"{PROG}: warning: ").rstrip("\n")]


def test_only_mig_gpus_means_no_usable_gpu() -> None:
    plain = run(*recorded("h200-mig-1gpu"))
    required = run(*recorded("h200-mig-1gpu"), "--require-gpus")
    warning = (
        f"{PROG}: warning: GPU 0 (NVIDIA H200, 00000000:83:00.0) skipped: MIG mode is enabled; Slurm needs "
        "AutoDetect=nvml to schedule MIG instances, or turn MIG off with nvidia-smi -i 0 -mig 0\n"
    )
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "", warning)
    assert (required.returncode, required.stdout, required.stderr) == (3, "", warning + REQUIRE_MESSAGE)


# --- no GPU, no driver ---------------------------------------------------------


@pytest.mark.parametrize(("box", "message"), [("no-gpu", NO_DEVICES_MESSAGE), ("no-driver", NO_DRIVER_MESSAGE)])
@pytest.mark.parametrize("mode", [[], ["--gres"]])
def test_no_gpu_prints_nothing_and_succeeds(box: str, message: str, mode: list[str]) -> None:
    result = run(*recorded(box), *mode)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", message)


@pytest.mark.parametrize(("box", "message"), [("no-gpu", NO_DEVICES_MESSAGE), ("no-driver", NO_DRIVER_MESSAGE)])
def test_no_gpu_with_require_gpus_fails(box: str, message: str) -> None:
    result = run(*recorded(box), "--require-gpus")
    assert (result.returncode, result.stdout, result.stderr) == (3, "", message + REQUIRE_MESSAGE)


@pytest.mark.parametrize(
    ("box", "status", "message"),
    [("no-gpu", "no_devices", NO_DEVICES_MESSAGE), ("no-driver", "no_driver", NO_DRIVER_MESSAGE)],
)
def test_no_gpu_json(box: str, status: str, message: str) -> None:
    result = run(*recorded(box), "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout) == {
        "status": status,
        "message": message.removeprefix(f"{PROG}: ").rstrip("\n"),
        "gres": "",
        "types": [],
        "gpus": [],
        "skipped": [],
        "gres_conf": [],
        "warnings": [],
    }


# --- missing or partial sources -------------------------------------------------


def test_without_minors_file_index_order_is_assumed() -> None:
    result = run(*recorded("mixed-4090-3090", minors=False))
    assert result.stdout.splitlines() == [
        "Name=gpu Type=rtx4090 File=/dev/nvidia0",
        "Name=gpu Type=rtx4090 File=/dev/nvidia1",
        "Name=gpu Type=rtx3090 File=/dev/nvidia2",
        "Name=gpu Type=rtx3090 File=/dev/nvidia3",
    ]
    assert result.stderr == f"{PROG}: warning: no --minors-file; /dev/nvidiaN assumed to follow nvidia-smi's index\n"


def test_without_lscpu_file_cores_are_left_out() -> None:
    # Writing the affinity's CPU ids as Cores= would name cores 32-63 on a 32-core node.
    result = run(*recorded("rtx4090-x4", lscpu=False))
    assert result.stdout.splitlines() == [line.split(" Cores=")[0] for line in GRES_CONF["rtx4090-x4"]]
    assert result.stderr == (
        f"{PROG}: warning: no --lscpu-file to turn CPU ids into Slurm core indexes; Cores= left out\n"
    )


def test_without_topo_file_cores_are_left_out() -> None:
    result = run(*recorded("h100-x8", topo=False), "--json")
    document = json.loads(result.stdout)
    assert {(gpu["cpu_affinity"], gpu["cores"]) for gpu in document["gpus"]} == {(None, None)}
    assert result.stderr == f"{PROG}: warning: no --topo-file; Cores= left out\n"


def test_topo_copied_with_spaces_for_tabs(tmp_path: Path) -> None:
    spaced = tmp_path / "topo.txt"
    spaced.write_text((FIXTURES / "h100-x8" / "topo.txt").read_text().expandtabs(8))
    args = recorded("h100-x8", topo=False) + ["--topo-file", str(spaced)]
    assert run(*args).stdout.splitlines() == GRES_CONF["h100-x8"]


def test_affinity_na_leaves_cores_out_everywhere(tmp_path: Path) -> None:
    # A VM's nvidia-smi may not know the affinity; Cores= on only some lines makes slurmctld log an error.
    topo = (FIXTURES / "rtx4090-x4" / "topo.txt").read_text().replace("16-31,48-63\t1", "N/A\t1")
    (tmp_path / "topo.txt").write_text(topo)
    result = run(*recorded("rtx4090-x4", topo=False), "--topo-file", str(tmp_path / "topo.txt"))
    assert result.stdout.splitlines() == [line.split(" Cores=")[0] for line in GRES_CONF["rtx4090-x4"]]
    assert result.stderr == f"{PROG}: warning: no CPU affinity for GPU 2, 3 in the topology matrix; Cores= left out\n"


def test_query_without_mig_column_means_mig_off(tmp_path: Path) -> None:
    rows = (FIXTURES / "a100-mig" / "query.csv").read_text().splitlines()
    (tmp_path / "query.csv").write_text("\n".join(line.rsplit(", ", 1)[0] for line in rows) + "\n")
    args = ["--query-file", str(tmp_path / "query.csv")] + recorded("a100-mig")[2:]
    assert run(*args, "--gres").stdout == "gpu:a100:4\n"


# --- type names ----------------------------------------------------------------


def test_type_override_on_the_command_line() -> None:
    result = run(*recorded("h100-x8"), "--gres", "--type", "nvidia h100 80gb  HBM3=h100sxm")
    assert (result.returncode, result.stdout) == (0, "gpu:h100sxm:8\n")


def test_type_map_file(tmp_path: Path) -> None:
    type_map = tmp_path / "types"
    type_map.write_text("# site names\nNVIDIA GeForce RTX 3090 = rtx3090nvl  # bridged pair\n\n")
    result = run(*recorded("mixed-4090-3090"), "--gres", "--type-map", str(type_map))
    assert (result.returncode, result.stdout) == (0, "gpu:rtx3090nvl:2,gpu:rtx4090:2\n")


def test_command_line_type_wins_over_type_map(tmp_path: Path) -> None:
    type_map = tmp_path / "types"
    type_map.write_text("NVIDIA H200=h200a\n")
    result = run(*recorded("h200-x8"), "--gres", "--type-map", str(type_map), "--type", "NVIDIA H200=h200b")
    assert result.stdout == "gpu:h200b:8\n"


@pytest.mark.parametrize("bad", ["NVIDIA H200", "NVIDIA H200=H200", "NVIDIA H200=h 200", "=h200"])
def test_bad_type_override_is_a_usage_error(bad: str) -> None:
    result = run(*recorded("h200-x8"), "--type", bad)
    assert (result.returncode, result.stdout) == (2, "")
    assert "--type " in result.stderr


def test_bad_type_map_line_names_the_line(tmp_path: Path) -> None:
    type_map = tmp_path / "types"
    type_map.write_text("NVIDIA H200=h200\nNVIDIA H100 80GB HBM3=H100!\n")
    result = run(*recorded("h100-x8"), "--type-map", str(type_map))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"{PROG}: error: {type_map}:2: type 'H100!' must match ^[a-z0-9][a-z0-9_-]{{0,31}}$\n")


# --- errors ----------------------------------------------------------------------


def test_topology_of_another_machine_is_refused() -> None:
    args = recorded("rtx4090-x4", topo=False) + ["--topo-file", str(FIXTURES / "h100-x8" / "topo.txt")]
    result = run(*args)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"{PROG}: error: the topology matrix shows GPUs [0, 1, 2, 3, 4, 5, 6, 7] but the GPU query shows "
        "[0, 1, 2, 3]; were both recorded on the same machine?\n"
    )


def test_gpu_missing_from_minors_file_is_refused() -> None:
    args = recorded("rtx4090-x4", minors=False) + ["--minors-file", str(FIXTURES / "rtx3090-x2" / "minors.txt")]
    result = run(*args)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"{PROG}: error: no Device Minor for GPU 0 (00000000:18:00.0) in {FIXTURES / 'rtx3090-x2' / 'minors.txt'}\n"
    )


def test_gpu_fallen_off_the_bus_is_an_error(tmp_path: Path) -> None:
    # nvidia-smi prints this row among the others; a gres.conf without that GPU would hide it.
    query = (FIXTURES / "rtx4090-x4" / "query.csv").read_text()
    query += "Unable to determine the device handle for GPU0000:D8:00.0: Unknown Error\n"
    (tmp_path / "query.csv").write_text(query)
    result = run("--query-file", str(tmp_path / "query.csv"))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"{PROG}: error: unexpected line in the GPU query output: "
        "'Unable to determine the device handle for GPU0000:D8:00.0: Unknown Error'\n"
    )


def test_unreadable_file_is_an_error(tmp_path: Path) -> None:
    result = run("--query-file", str(tmp_path / "absent.csv"))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"{PROG}: error: cannot read {tmp_path / 'absent.csv'}: No such file or directory\n"


def test_recorded_extras_need_a_query_file() -> None:
    result = run("--topo-file", str(FIXTURES / "h100-x8" / "topo.txt"))
    assert result.returncode == 2
    assert "--topo-file need --query-file" in result.stderr


def test_help_documents_exit_status_and_mig() -> None:
    result = run("--help")
    assert result.returncode == 0
    for text in ("Exit status:", "--require-gpus was given and no usable GPU", "MIG", "AutoDetect=nvml", "Cores"):
        assert text in result.stdout


# --- live mode: what runs, and how its failures read ------------------------------


def stand_in(directory: Path, name: str, body: str) -> None:
    """An executable shell script standing in for a program this machine lacks."""
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def live_env(bin_dir: Path) -> dict[str, str]:
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}


def test_live_without_nvidia_smi(tmp_path: Path) -> None:
    plain = run("--json", env={"PATH": str(tmp_path)})
    required = run("--require-gpus", env={"PATH": str(tmp_path)})
    message = "nvidia-smi not found; is the NVIDIA driver installed?"
    assert plain.returncode == 0
    assert json.loads(plain.stdout)["status"] == "no_driver"
    assert plain.stderr == f"{PROG}: {message}\n"
    assert (required.returncode, required.stdout, required.stderr) == (3, "", f"{PROG}: {message}\n{REQUIRE_MESSAGE}")


def test_live_driver_not_loaded(tmp_path: Path) -> None:
    stand_in(tmp_path, "nvidia-smi", f"cat '{FIXTURES / 'no-driver' / 'query.csv'}'\nexit 9\n")
    result = run(env=live_env(tmp_path))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", NO_DRIVER_MESSAGE)


def test_live_unexpected_failure_is_an_error(tmp_path: Path) -> None:
    stand_in(tmp_path, "nvidia-smi", "echo 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    result = run(env=live_env(tmp_path))
    assert (result.returncode, result.stdout, result.stderr) == (
        1,
        "",
        f"{PROG}: error: nvidia-smi exited with status 18: Failed to initialize NVML: Driver/library version mismatch\n",
    )


def test_live_timeout_is_an_error(tmp_path: Path) -> None:
    stand_in(tmp_path, "nvidia-smi", "exec sleep 30\n")
    result = run("--timeout", "0.5", env=live_env(tmp_path))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"{PROG}: error: nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,mig.mode.current "
        "--format=csv did not finish within 0.5 s\n"
    )


@pytest.mark.skipif(Path("/proc/driver/nvidia/gpus").exists(), reason="a real driver's minors would be read")
def test_live_runs_nvidia_smi_and_lscpu(tmp_path: Path) -> None:
    box = FIXTURES / "rtx4090-x4"
    log = tmp_path / "argv.log"
    stand_in(
        tmp_path,
        "nvidia-smi",
        f"echo \"nvidia-smi $*\" >> '{log}'\n"
        f"case \"$1\" in topo) cat '{box / 'topo.txt'}' ;; *) cat '{box / 'query.csv'}' ;; esac\n",
    )
    stand_in(tmp_path, "lscpu", f"echo \"lscpu $*\" >> '{log}'\ncat '{box / 'lscpu.txt'}'\n")
    result = run(env=live_env(tmp_path))
    assert log.read_text().splitlines() == [
        "nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,mig.mode.current --format=csv",
        "nvidia-smi topo -m",
        "lscpu --parse=CPU,CORE,SOCKET",
    ]
    assert (result.returncode, result.stdout.splitlines()) == (0, GRES_CONF["rtx4090-x4"])
    assert result.stderr == (
        f"{PROG}: warning: cannot read device minors (/proc/driver/nvidia/gpus: no 'Device Minor' line); "
        "/dev/nvidiaN assumed to follow nvidia-smi's index\n"
    )


# --- pure functions ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "gpu_type"),
    [
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"),
        ("NVIDIA GeForce RTX 4090 D", "rtx4090d"),
        ("NVIDIA GeForce RTX 5090", "rtx5090"),
        ("GeForce RTX 2080 SUPER", "rtx2080super"),
        ("NVIDIA GeForce GTX 1080 Ti", "gtx1080ti"),
        ("NVIDIA TITAN RTX", "titanrtx"),
        ("NVIDIA RTX A6000", "rtxa6000"),
        ("NVIDIA RTX A4000", "rtxa4000"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
        ("Quadro RTX 8000", "rtx8000"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-PCIE-40GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("Tesla T4", "t4"),
        ("  nvidia   geforce rtx 4090 ", "rtx4090"),
    ],
)
def test_normalise_gpu_type(discover_module: ModuleType, name: str, gpu_type: str) -> None:
    assert discover_module.normalise_gpu_type(name) == gpu_type


def test_3090_and_4090_stay_apart(discover_module: ModuleType) -> None:
    # openhpc's discovery took the second word, making both "GeForce".
    normalise = discover_module.normalise_gpu_type
    assert normalise("NVIDIA GeForce RTX 3090") != normalise("NVIDIA GeForce RTX 4090")


@pytest.mark.parametrize(
    ("numbers", "text"),
    [([], ""), ([3], "3"), ([0, 1], "0-1"), ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), (list(range(56)), "0-55")],
)
def test_format_ranges(discover_module: ModuleType, numbers: list[int], text: str) -> None:
    assert discover_module.format_ranges(numbers) == text


def test_parse_cpu_list(discover_module: ModuleType) -> None:
    assert discover_module.parse_cpu_list("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    for bad in ("", "3-1", "0-x", "N/A"):
        with pytest.raises(ValueError):
            discover_module.parse_cpu_list(bad)


def test_lscpu_cores_numbered_socket_by_socket(discover_module: ModuleType) -> None:
    # A BIOS that alternates sockets in CPU ids: Slurm still counts socket 0's cores first.
    text = "# CPU,Core,Socket\n0,0,0\n1,1,1\n2,2,0\n3,3,1\n4,0,0\n5,1,1\n6,2,0\n7,3,1\n"
    assert discover_module.parse_lscpu(text) == {0: 0, 2: 1, 4: 0, 6: 1, 1: 2, 3: 3, 5: 2, 7: 3}


def test_bus_ids_of_nvidia_smi_and_proc_compare_equal(discover_module: ModuleType) -> None:
    assert discover_module.bus_key("00000000:1B:00.0") == discover_module.bus_key("0000:1b:00.0") == (0, 0x1B, 0, 0)
    assert discover_module.bus_key("[N/A]") is None


def test_read_proc_minors(discover_module: ModuleType, tmp_path: Path) -> None:
    for bus, minor in (("0000:3b:00.0", 1), ("0000:18:00.0", 0)):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nBus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
        )
    assert discover_module.read_proc_minors(tmp_path) == {(0, 0x18, 0, 0): 0, (0, 0x3B, 0, 0): 1}


@pytest.mark.skipif(Path("/proc/driver/nvidia/gpus").exists(), reason="a real driver's minors would be read")
def test_live_lscpu_failure_costs_only_cores(tmp_path: Path) -> None:
    box = FIXTURES / "rtx4090-x4"
    stand_in(
        tmp_path,
        "nvidia-smi",
        f"case \"$1\" in topo) cat '{box / 'topo.txt'}' ;; *) cat '{box / 'query.csv'}' ;; esac\n",
    )
    stand_in(tmp_path, "lscpu", "echo 'lscpu: failed to read /sys' >&2\nexit 1\n")
    result = run("--gres", env=live_env(tmp_path))
    assert (result.returncode, result.stdout) == (0, "gpu:rtx4090:4\n")
    assert result.stderr.splitlines()[-1] == (
        f"{PROG}: warning: lscpu failed (lscpu: failed to read /sys); Cores= left out"
    )
