"""gpupool-gpu-check: its verdict on recorded nvidia-smi outputs and kernel logs, and what it does about it.

Healthy nodes are the real captures in ../shared/external-data/nvidia-smi/ (read
in place; skipped with a message where that folder is absent); each fault class
is a small written output in tests/unit/fixtures/gpu-health/ (its README says
what each holds). The end-to-end tests run the check with stand-in nvidia-smi
and scontrol scripts, so the drain is the scontrol command line Slurm would get.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from pathlib import Path

import pytest

from gpupool.gpu_health import check, jobs, probe
from gpupool.gpu_health.check import WARN, Facts, NvidiaSmiResult, Thresholds, judge
from gpupool.gpu_health.failure import GpuFailure, parse_comment
from gpupool.gpu_health.main import ConfigUnreadable, load_config, main
from gpupool.gpu_health.state import exclusive_run

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "gpu-health"
CAPTURES = REPO.parent / "shared" / "external-data" / "nvidia-smi"
WRITTEN = Path(__file__).parent / "fixtures" / "nvidia-smi"


def capture(relative: str) -> Path:
    path = CAPTURES / relative
    if not path.exists():
        pytest.skip(f"{path} is not on this machine (../shared/external-data/SOURCES.md)")
    return path


def exporter_query_section(path: Path, phase: str) -> str:
    """The ``--query-gpu ... --format=csv`` output of one phase of a nvidia_gpu_exporter capture."""
    lines = path.read_text().splitlines()
    title = next(n for n, line in enumerate(lines) if line.startswith(f"# {phase} :: query-gpu (csv"))
    body: list[str] = []
    for line in lines[title + 3:]:  # the title, the command, a line of '#'
        if not line.strip() or line.startswith("####"):
            break
        body.append(line)
    return "\n".join(body) + "\n"


DEFAULTS = Thresholds()


def devices(count: int) -> list[str]:
    return [f"/dev/nvidia{n}" for n in range(count)]


def verdict_for(query: str, promised: int, *, returncode: int = 0, xids: str = "", streaks: dict[str, int] | None = None,
                thresholds: Thresholds = DEFAULTS) -> check.Verdict:
    facts = Facts(
        promised_devices=devices(promised), missing_devices=[],
        nvidia_smi=NvidiaSmiResult(stdout=query, returncode=returncode),
        xid_events=check.xid_events(record.message for record in probe.parse_kmsg(xids.encode())),
    )
    return judge(facts, thresholds, streaks)


# -- healthy nodes, from real captures ---------------------------------------------

EXPORTER_CAPTURES = [
    "linux-x86_64__nvidia-h200__590.48.01.txt",
    "linux-x86_64__nvidia-h200-mig__590.48.01.txt",
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
    "linux-x86_64__nvidia-l40s__595.80.txt",
    "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt",
    "linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt",
]


@pytest.mark.parametrize("name", EXPORTER_CAPTURES)
@pytest.mark.parametrize("phase", ["idle", "load"])
def test_a_healthy_node_idle_or_loaded_passes(name: str, phase: str) -> None:
    query = exporter_query_section(capture(f"nvidia_gpu_exporter_captures/{name}"), phase)

    verdict = verdict_for(query, promised=1)

    assert verdict.findings == ()
    assert verdict.drain_reason is None


def test_the_h200_read_on_real_hardware_passes_with_its_bus_id_read() -> None:
    query = capture("real-h200-2026-12-04/query.csv").read_text()

    readings = check.parse_query_csv(query)
    verdict = verdict_for(query, promised=1)

    assert [(r.index, r.bus_id, r.name) for r in readings] == [(0, "0000:00:06.0", "NVIDIA H200")]
    assert verdict.findings == ()


def test_a_4090_under_load_passes() -> None:
    # A log of one loaded 4090 (no index column): its first sample is the node's one GPU.
    lines = capture("vlm_optimization_gpu_log_RTX4090.csv").read_text().splitlines()

    verdict = verdict_for("\n".join(lines[:2]) + "\n", promised=1)

    assert verdict.findings == ()


@pytest.mark.parametrize("machine, count", [("rtx3090-x2", 2), ("rtx4090-x4", 4), ("mixed-4090-3090", 4)])
def test_consumer_nodes_pass_when_nvidia_smi_sees_what_gres_conf_promised(machine: str, count: int) -> None:
    # No real 3090 capture exists: these are the discovery tests' written outputs (their README says how).
    verdict = verdict_for((WRITTEN / machine / "query.csv").read_text(), promised=count)

    assert verdict.findings == ()


# -- each fault class --------------------------------------------------------------


def test_fewer_gpus_than_gres_conf_promised_drains() -> None:
    verdict = verdict_for((WRITTEN / "rtx4090-x4" / "query.csv").read_text(), promised=5)

    assert verdict.drain_reason == "gpu: nvidia-smi sees 4 GPU(s), gres.conf promises 5"


def test_a_gpu_lost_off_the_bus_drains_naming_its_bus_id() -> None:
    verdict = verdict_for((FIXTURES / "lost-4x4090.txt").read_text(), promised=4, returncode=15)

    assert verdict.drain_reason == "gpu: 0000:86:00.0 is lost (fallen off the bus)"


def test_the_lost_gpus_message_line_is_never_read_as_a_row() -> None:
    readings = check.parse_query_csv((FIXTURES / "lost-4x4090.txt").read_text())

    assert [r.bus_id for r in readings] == ["0000:18:00.0", "0000:3b:00.0", "0000:af:00.0"]


def test_xid_79_in_the_kernel_log_drains_with_the_xid_as_slurms_reason() -> None:
    query = (WRITTEN / "rtx4090-x4" / "query.csv").read_text()

    verdict = verdict_for(query, promised=4, xids=(FIXTURES / "kmsg-xid.txt").read_text())

    assert verdict.drain_reason == "gpu: Xid 79 on 0000:86:00.0"
    assert check.Finding(WARN, "Xid 13 on 0000:3b:00.0") in verdict.warnings


def test_a_contained_ecc_error_xid_94_only_warns() -> None:
    query = exporter_query_section(capture("nvidia_gpu_exporter_captures/" + EXPORTER_CAPTURES[0]), "load")

    verdict = verdict_for(query, promised=1, xids=(FIXTURES / "kmsg-xid94.txt").read_text())

    assert verdict.drain_reason is None
    assert verdict.warnings == [check.Finding(WARN, "Xid 94 on 0000:83:00.0")]


@pytest.mark.parametrize("xid", sorted(check.XID_RULES))
def test_every_xid_in_the_table_gets_its_rules_action(xid: int) -> None:
    line = f"4,1,1,-;NVRM: Xid (PCI:0000:41:00): {xid}, pid=1, name=x, something\n"

    verdict = verdict_for("", promised=0, xids=line)

    assert [(f.action, f.reason) for f in verdict.findings] == [(check.XID_RULES[xid].action, f"Xid {xid} on 0000:41:00.0")]


@pytest.mark.parametrize("fixture, reason", [
    ("ecc-2xh200.csv", "gpu: 2 uncorrectable ECC error(s) on 0000:84:00.0"),
    ("remap-failure-2xh200.csv", "gpu: row remapping failed on 0000:83:00.0"),
    ("remap-pending-2xh200.csv", "gpu: row remapping pending on 0000:84:00.0 (reset the GPU)"),
    ("hot-4x4090.csv", "gpu: 0000:86:00.0 at 97 C (drain at 95)"),
])
def test_memory_and_temperature_faults_drain(fixture: str, reason: str) -> None:
    query = (FIXTURES / fixture).read_text()

    verdict = verdict_for(query, promised=len(check.parse_query_csv(query)))

    assert verdict.drain_reason == reason


def test_a_gpu_past_the_warning_temperature_only_warns() -> None:
    verdict = verdict_for((FIXTURES / "hot-4x4090.csv").read_text(), promised=4)

    assert verdict.warnings == [check.Finding(WARN, "0000:3b:00.0 at 88 C (warn at 85)")]


def test_temperature_thresholds_are_the_operators() -> None:
    verdict = verdict_for((FIXTURES / "hot-4x4090.csv").read_text(), promised=4,
                          thresholds=Thresholds(temperature_warn_c=98, temperature_drain_c=99))

    assert verdict.findings == ()


def test_hardware_throttling_warns_then_drains_once_it_persists() -> None:
    query = (FIXTURES / "throttle-2x3090.csv").read_text()
    thresholds = Thresholds(throttle_drain_after_checks=3)

    first = verdict_for(query, promised=2, thresholds=thresholds)
    second = verdict_for(query, promised=2, thresholds=thresholds, streaks=dict(first.throttle_streaks))
    third = verdict_for(query, promised=2, thresholds=thresholds, streaks=dict(second.throttle_streaks))

    assert first.drain_reason is None and second.drain_reason is None
    assert first.warnings == [check.Finding(WARN, "0000:21:00.0 throttling (hw_thermal_slowdown) on 1 check(s) in a row")]
    assert third.drain_reason == "gpu: 0000:21:00.0 throttling (hw_thermal_slowdown) on 3 check(s) in a row"


def test_several_causes_name_the_first_and_count_the_rest() -> None:
    verdict = verdict_for((FIXTURES / "lost-4x4090.txt").read_text(), promised=4, returncode=15,
                          xids=(FIXTURES / "kmsg-xid.txt").read_text())

    assert verdict.drain_reason == "gpu: Xid 79 on 0000:86:00.0 (+1 more)"


def failing_verdicts() -> list[check.Verdict]:
    """One verdict of each kind of drain the check gives, from the fixtures above."""
    written = (WRITTEN / "rtx4090-x4" / "query.csv").read_text()
    verdicts = [
        verdict_for(written, promised=5),
        verdict_for((FIXTURES / "lost-4x4090.txt").read_text(), promised=4, returncode=15),
        verdict_for(written, promised=4, xids=(FIXTURES / "kmsg-xid.txt").read_text()),
        verdict_for((FIXTURES / "lost-4x4090.txt").read_text(), promised=4, returncode=15,
                    xids=(FIXTURES / "kmsg-xid.txt").read_text()),
        judge(Facts(devices(2), ["/dev/nvidia1"], NvidiaSmiResult(missing=True)), Thresholds()),
        judge(Facts(devices(1), [], NvidiaSmiResult(stdout="NVIDIA-SMI has failed.\n", returncode=9)), Thresholds()),
        verdict_for((FIXTURES / "throttle-2x3090.csv").read_text(), promised=2,
                    thresholds=Thresholds(throttle_drain_after_checks=1)),
    ]
    for fixture in ("ecc-2xh200.csv", "remap-failure-2xh200.csv", "remap-pending-2xh200.csv", "hot-4x4090.csv"):
        query = (FIXTURES / fixture).read_text()
        verdicts.append(verdict_for(query, promised=len(check.parse_query_csv(query))))
    for xid in sorted(check.XID_RULES):
        verdicts.append(verdict_for("", promised=0, xids=f"4,1,1,-;NVRM: Xid (PCI:0000:41:00): {xid}, pid=1, name=x\n"))
    return [verdict for verdict in verdicts if verdict.drain_reason is not None]


def test_billing_reads_the_failed_gpu_back_from_every_drain_reason_that_names_one_and_none_from_the_rest() -> None:
    verdicts = failing_verdicts()
    read_back = [(v.drain_reason, check.failed_gpu_in_drain_reason(v.drain_reason or "")) for v in verdicts]
    expected = []
    for verdict in verdicts:
        first = sorted(verdict.drains, key=lambda finding: finding.failed_gpu is None)[0]
        named = (first.failed_gpu, first.xid) if first.failed_gpu is not None else None
        expected.append((verdict.drain_reason, named))

    assert read_back == expected
    # Both kinds are among them, and an operator's own reason names no GPU.
    assert {named is None for _, named in read_back} == {True, False}
    assert check.failed_gpu_in_drain_reason("replaced the fan; Kim") is None
    assert check.failed_gpu_in_drain_reason("gpu: Xid 79 on 0000:41:00.0 and a story") is None


def test_a_failed_gpu_is_named_first_whatever_else_drains() -> None:
    # nvidia-smi's count is judged before each GPU's readings, and names no GPU.
    verdict = verdict_for((FIXTURES / "ecc-2xh200.csv").read_text(), promised=3)

    assert verdict.drain_reason == "gpu: 2 uncorrectable ECC error(s) on 0000:84:00.0 (+1 more)"
    assert [finding.reason for finding in verdict.drains][0] == "nvidia-smi sees 2 GPU(s), gres.conf promises 3"


def test_nvidia_smi_failing_without_a_lost_gpu_drains_with_its_message() -> None:
    facts = Facts(devices(1), [], NvidiaSmiResult(
        stdout="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", returncode=9))

    verdict = judge(facts, Thresholds())

    assert verdict.drain_reason == (
        "gpu: nvidia-smi failed (exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.)"
    )


def test_without_nvidia_smi_only_the_device_files_are_judged() -> None:
    healthy = judge(Facts(devices(2), [], NvidiaSmiResult(missing=True)), Thresholds())
    missing = judge(Facts(devices(2), ["/dev/nvidia1"], NvidiaSmiResult(missing=True)), Thresholds())

    assert healthy.findings == ()
    assert missing.drain_reason == "gpu: /dev/nvidia1 missing (gres.conf names it)"


# -- gres.conf and the kernel log --------------------------------------------------


def test_gres_conf_lines_for_this_node_and_for_every_node_count_others_do_not() -> None:
    gres_conf = (
        "# written by the playbook\n"
        "NodeName=gpu1 Name=gpu Type=rtx4090 File=/dev/nvidia[0-1] Cores=0-15\n"
        "NodeName=gpu2 Name=gpu Type=rtx3090 File=/dev/nvidia[0-3]\n"
        "Name=gpu Type=a100 File=/dev/nvidia7\n"
        "NodeName=gpu[1-2] Name=mps Count=100\n"
    )

    assert check.promised_gpu_devices(gres_conf, "gpu1") == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia7"]


def test_kernel_records_after_the_cursor_only(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text((FIXTURES / "kmsg-xid.txt").read_text())

    records, cursor = probe.new_xid_events(str(log), after_sequence=1004)

    assert [record.sequence for record in records] == [1005, 1006]
    assert cursor == 1006


# -- probing nvidia-smi --------------------------------------------------------------


def stand_in(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_hung_nvidia_smi_is_timed_out_into_a_drain(tmp_path: Path) -> None:
    smi = stand_in(tmp_path / "nvidia-smi", "exec sleep 30\n")

    result = probe.run_nvidia_smi(str(smi), timeout_s=0.2)
    verdict = judge(Facts(devices(1), [], result), Thresholds())

    assert result.timed_out
    assert verdict.drain_reason == "gpu: nvidia-smi hung (no answer within its timeout)"


def test_an_nvidia_smi_others_could_replace_is_never_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    smi = stand_in(tmp_path / "nvidia-smi", f"touch {ran}\n")
    smi.chmod(0o777)

    result = probe.run_nvidia_smi(str(smi), timeout_s=10)

    assert not ran.exists()
    assert result.stderr == f"not run: {smi} is writable by others"
    assert (judge(Facts(devices(1), [], result), Thresholds()).drain_reason or "").startswith(
        "gpu: nvidia-smi failed (exit 126: not run: "
    )


def test_a_driver_that_refuses_the_row_remapping_fields_is_asked_without_them(tmp_path: Path) -> None:
    smi = stand_in(tmp_path / "nvidia-smi", (
        'case "$1" in *remapped_rows*) echo \'Field "remapped_rows.pending" is not a valid field to query.\'; exit 2;; esac\n'
        'echo "index, pci.bus_id, name, temperature.gpu, ecc.errors.uncorrected.volatile.total, clocks_throttle_reasons.active"\n'
        'echo "0, 00000000:21:00.0, NVIDIA GeForce RTX 3090, 60, [N/A], 0x0000000000000000"\n'
    ))

    result = probe.run_nvidia_smi(str(smi), timeout_s=10)

    assert judge(Facts(devices(1), [], result), Thresholds()).findings == ()


# -- the whole check, as Slurm runs it -----------------------------------------------


class Node:
    """A node in a folder: gres.conf, device files, stand-in nvidia-smi and scontrol, a kernel log, the config."""

    def __init__(self, root: Path, gpus: int = 2, state: str = "IDLE") -> None:
        self.root = root
        self.devices = [root / f"nvidia{n}" for n in range(gpus)]
        for device in self.devices:
            device.touch()
        (root / "gres.conf").write_text(f"NodeName=gpu1 Name=gpu Type=rtx3090 File={root}/nvidia[0-{gpus - 1}]\n")
        self.scontrol_calls = root / "scontrol-calls"
        stand_in(root / "scontrol", (
            f'echo "$@" >> {self.scontrol_calls}\n'
            f'[ "$1" = --oneliner ] && echo "NodeName=gpu1 Arch=x86_64 State={state} ThreadsPerCore=1"\n'
            "exit 0\n"
        ))
        self.kernel_log = root / "kmsg"
        self.kernel_log.write_text("6,1,1,-;Linux version 6.8.0\n")
        (root / "boot_id").write_text("boot-1\n")
        self.smi_output = root / "smi-output"
        self.smi_output.write_text((WRITTEN / "rtx3090-x2" / "query.csv").read_text())
        stand_in(root / "nvidia-smi", f"cat {self.smi_output}\n")
        # squeue --json as slurmctld answers it: the jobs running on the node, and the GPU indices they hold.
        self.queue = root / "squeue.json"
        self.queue.write_text('{"jobs": []}')
        stand_in(root / "squeue", f"cat {self.queue}\n")
        stand_in(root / "scancel", f'echo "scancel $@" >> {self.scontrol_calls}\n')
        self.config = root / "gpu-check.json"
        self.config.write_text(json.dumps({
            "node_name": "gpu1", "gres_conf": str(root / "gres.conf"), "nvidia_smi": str(root / "nvidia-smi"),
            "scontrol": str(root / "scontrol"), "kernel_log": str(self.kernel_log),
            "squeue": str(root / "squeue"), "scancel": str(root / "scancel"),
            "boot_id_file": str(root / "boot_id"), "state_dir": str(root / "state"), "nvidia_smi_timeout_s": 10,
        }))

    def run(self) -> int:
        return main(["--config", str(self.config)])

    def running(self, *jobs: tuple[int, str, str] | tuple[int, str, str, bool]) -> None:
        """Jobs (id, QOS, GRES detail on gpu1[, requeue]) squeue lists as running on the node, beside one on another node.

        ``requeue``: squeue --json's own flag (Slurm 22.05, openapi v0.0.38's job dump: ``job->requeue``),
        true for a job submitted with sbatch --requeue; false (--no-requeue) when not given.
        """
        listed = [{"job_id": job[0], "job_state": "RUNNING", "nodes": "gpu1", "qos": job[1], "gres_detail": [job[2]],
                   "requeue": job[3] if len(job) > 3 else False} for job in jobs]
        listed.append({"job_id": 99, "job_state": "RUNNING", "nodes": "gpu2", "qos": "normal",
                       "gres_detail": ["gpu:rtx3090:2(IDX:0-1)"], "requeue": True})
        self.queue.write_text(json.dumps({"jobs": listed}))

    def commands(self) -> list[str]:
        """What the check asked of Slurm, past the node lookup."""
        if not self.scontrol_calls.exists():
            return []
        return [line for line in self.scontrol_calls.read_text().splitlines() if not line.startswith("--oneliner")]

    def scontrol_updates(self) -> list[str]:
        if not self.scontrol_calls.exists():
            return []
        return [line for line in self.scontrol_calls.read_text().splitlines() if line.startswith("update")]


def test_a_healthy_node_exits_0_and_leaves_slurm_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path)

    assert node.run() == 0
    assert node.scontrol_updates() == []
    assert capsys.readouterr().err == ""


def test_a_node_gres_conf_promises_no_gpu_is_not_judged_by_nvidia_smi(tmp_path: Path) -> None:
    node = Node(tmp_path)
    (tmp_path / "gres.conf").write_text("NodeName=gpu2 Name=gpu File=/dev/nvidia[0-1]\n")
    node.smi_output.write_text("No devices were found\n")
    stand_in(tmp_path / "nvidia-smi", f"cat {node.smi_output}\nexit 6\n")

    assert node.run() == 0
    assert node.scontrol_updates() == []


def test_a_lost_gpu_drains_the_node_through_scontrol_with_the_gpu_reason(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.kernel_log.write_text((FIXTURES / "kmsg-xid.txt").read_text())

    status = node.run()

    assert status == 1
    assert node.scontrol_updates() == ["update nodename=gpu1 state=drain reason=gpu: Xid 79 on 0000:86:00.0"]


def test_a_missing_device_file_drains_where_there_is_no_nvidia_smi(tmp_path: Path) -> None:
    node = Node(tmp_path)
    (tmp_path / "nvidia-smi").unlink()
    node.devices[1].unlink()

    assert node.run() == 1
    assert node.scontrol_updates() == [f"update nodename=gpu1 state=drain reason=gpu: {node.devices[1]} missing (gres.conf names it)"]


def test_an_xid_is_read_once_the_next_check_starts_after_it(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.kernel_log.write_text((FIXTURES / "kmsg-xid.txt").read_text())
    node.run()

    status = node.run()

    assert status == 0
    assert len(node.scontrol_updates()) == 1


def test_after_a_reboot_the_kernel_log_is_read_from_its_start(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.kernel_log.write_text((FIXTURES / "kmsg-xid.txt").read_text())
    node.run()
    (tmp_path / "boot_id").write_text("boot-2\n")

    node.run()

    assert len(node.scontrol_updates()) == 2


def test_a_node_already_drained_keeps_its_reason(tmp_path: Path) -> None:
    node = Node(tmp_path, state="IDLE+DRAIN")
    node.devices[0].unlink()

    assert node.run() == 1
    assert node.scontrol_updates() == []


def test_a_check_that_finds_another_running_steps_aside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path)
    node.devices[0].unlink()

    with exclusive_run(str(tmp_path / "state")) as holding:
        status = node.run()

    assert holding
    assert status == 0
    assert node.scontrol_updates() == []
    assert "another check is running" in capsys.readouterr().err


def test_dry_run_says_what_it_would_drain_and_drains_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path)
    node.devices[0].unlink()

    status = main(["--config", str(node.config), "--dry-run"])

    assert status == 1
    assert node.scontrol_updates() == []
    assert f"would drain: gpu: {node.devices[0]} missing" in capsys.readouterr().err


def test_an_unknown_setting_in_the_config_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "gpu-check.json"
    config.write_text(json.dumps({"temperature_warn": 80}))

    with pytest.raises(ConfigUnreadable, match="unknown setting"):
        load_config(str(config))


def test_a_missing_config_means_the_defaults(tmp_path: Path) -> None:
    config = load_config(str(tmp_path / "absent.json"))

    assert config.nvidia_smi == "/usr/bin/nvidia-smi"
    assert config.thresholds == Thresholds()


def test_the_state_file_is_written_whole(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.run()

    saved = json.loads((tmp_path / "state" / "state.json").read_text())

    assert saved["boot_id"] == "boot-1" and saved["kernel_sequence"] == 1
    assert not [name for name in os.listdir(tmp_path / "state") if name.startswith("state.json.")]


# -- what the playbook copies to a compute node -------------------------------------

# deploy/ansible/roles/slurm_compute/tasks/gpu_check.yml copies exactly these files; a node has no virtualenv.
COPIED = {"gpupool/__init__.py", "gpupool/errors.py", "gpupool/proc.py"} | {
    f"gpupool/gpu_health/{path.name}" for path in (REPO / "gpupool" / "gpu_health").glob("*.py")
}


def test_the_check_needs_only_the_files_the_playbook_copies_and_the_standard_library() -> None:
    import ast
    import sys

    outside: set[str] = set()
    for relative in COPIED:
        for node in ast.walk(ast.parse((REPO / relative).read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                top = name.split(".")[0]
                copied = name.replace(".", "/") + ".py" in COPIED or f"{name.replace('.', '/')}/__init__.py" in COPIED
                if top != "__future__" and top not in sys.stdlib_module_names and not copied:
                    outside.add(name)

    assert outside == set()

def test_the_playbook_copies_every_file_of_the_check() -> None:
    tasks = (REPO / "deploy" / "ansible" / "roles" / "slurm_compute" / "tasks" / "gpu_check.yml").read_text()

    assert {relative for relative in COPIED if relative in tasks} == COPIED


def test_the_node_name_slurmd_passes_its_health_check_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path)
    (tmp_path / "gres.conf").write_text(f"NodeName=gpu7 Name=gpu File={tmp_path}/nvidia[0-1]\n")
    node.devices[0].unlink()
    monkeypatch.setenv("SLURMD_NODENAME", "gpu7")

    node.run()

    assert node.scontrol_updates()[0].startswith("update nodename=gpu7 state=drain")


# -- jobs on a failed GPU ------------------------------------------------------------


def test_an_xid_79_ends_the_jobs_on_that_gpu_and_leaves_the_healthy_gpus_jobs_running(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.run()  # healthy: the check learns which bus id is which Slurm index
    node.smi_output.write_text("Unable to determine the device handle for GPU0000:4A:00.0: GPU is lost.\n")
    node.running((11, "normal", "gpu:rtx3090:1(IDX:0)"), (12, "normal", "gpu:rtx3090:1(IDX:1)"),
                 (13, "spot", "gpu:rtx3090:2(IDX:0-1)"))

    assert node.run() == 1

    [drain, comment_12, cancel_12, comment_13, requeue_13] = node.commands()
    assert drain == "update nodename=gpu1 state=drain reason=gpu: 0000:4a:00.0 is lost (fallen off the bus)"
    assert comment_12.startswith("update jobid=12 admincomment=gpu_failure: 0000:4a:00.0 is lost (fallen off the bus); "
                                 "node=gpu1; gpu=0000:4a:00.0; at=")
    assert cancel_12 == "scancel 12"
    assert comment_13.startswith("update jobid=13 admincomment=gpu_failure: ")
    assert requeue_13 == "requeue 13"  # spot: Slurm requeues it onto a healthy node


def test_a_job_slurm_may_requeue_is_requeued_whatever_its_qos(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.run()
    node.smi_output.write_text("Unable to determine the device handle for GPU0000:4A:00.0: GPU is lost.\n")
    # 14 asked for requeue_on_failure (sbatch --requeue); 15 did not (--no-requeue); both full price.
    node.running((14, "normal", "gpu:rtx3090:1(IDX:1)", True), (15, "normal", "gpu:rtx3090:1(IDX:1)", False))

    assert node.run() == 1

    [_drain, comment_14, requeue_14, comment_15, cancel_15] = node.commands()
    assert comment_14.startswith("update jobid=14 admincomment=gpu_failure: 0000:4a:00.0 is lost")
    assert requeue_14 == "requeue 14"
    assert comment_15.startswith("update jobid=15 admincomment=gpu_failure: ")
    assert cancel_15 == "scancel 15"


def test_a_missing_device_file_ends_the_jobs_holding_that_gpu_by_its_gres_index(tmp_path: Path) -> None:
    node = Node(tmp_path)
    (tmp_path / "nvidia-smi").unlink()
    node.devices[0].unlink()
    node.running((21, "normal", "gpu:rtx3090:1(IDX:0)"), (22, "normal", "gpu:rtx3090:1(IDX:1)"))

    assert node.run() == 1

    [_drain, comment, cancel] = node.commands()
    assert comment.startswith(f"update jobid=21 admincomment=gpu_failure: {node.devices[0]} missing (gres.conf names it); ")
    assert cancel == "scancel 21"


def test_a_hot_gpu_drains_the_node_but_its_jobs_finish(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.smi_output.write_text(
        "index, pci.bus_id, name, temperature.gpu\n0, 00000000:21:00.0, NVIDIA GeForce RTX 3090, 99\n"
        "1, 00000000:4A:00.0, NVIDIA GeForce RTX 3090, 50\n"
    )
    node.running((31, "normal", "gpu:rtx3090:1(IDX:0)"))

    assert node.run() == 1

    assert node.commands() == ["update nodename=gpu1 state=drain reason=gpu: 0000:21:00.0 at 99 C (drain at 95)"]


def test_a_lost_gpu_whose_index_was_never_seen_ends_no_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path)
    node.smi_output.write_text("Unable to determine the device handle for GPU0000:4A:00.0: GPU is lost.\n")
    node.running((41, "normal", "gpu:rtx3090:2(IDX:0-1)"))

    assert node.run() == 1

    assert [line for line in node.commands() if "jobid" in line or line.startswith("scancel")] == []
    assert "no Slurm index known for 0000:4a:00.0" in capsys.readouterr().err


def test_held_gpus_reads_each_nodes_indices_of_a_multinode_job() -> None:
    listing = json.dumps({"jobs": [
        {"job_id": 7, "job_state": "RUNNING", "nodes": "gpu[1-2]", "qos": "normal",
         "gres_detail": ["gpu:rtx4090:2(IDX:0-1)", "gpu:rtx4090:1(IDX:3)"]},
        {"job_id": 8, "job_state": "PENDING", "nodes": "", "qos": "normal", "gres_detail": []},
        {"job_id": 9, "job_state": "RUNNING", "nodes": "gpu2", "qos": "normal", "gres_detail": ["gpu:a:1(IDX:0),gpu:b:1(IDX:2)"],
         "requeue": True},
    ]})

    assert jobs.held_gpus(listing, "gpu2") == [
        jobs.HeldGpus(7, "normal", frozenset({3}), requeue=False), jobs.HeldGpus(9, "normal", frozenset({0, 2}), requeue=True),
    ]


def test_the_failure_comment_reads_back_as_written() -> None:
    at = dt.datetime(2026, 12, 4, 23, 30, 5, tzinfo=dt.UTC)
    written = GpuFailure(reason="Xid 79 on 0000:41:00.0", node="gpu1", gpu="0000:41:00.0", at=at, xid=79)

    assert parse_comment(written.comment()) == written
    assert written.end_reason() == "gpu_failure: Xid 79 on 0000:41:00.0 (node gpu1)"
    assert parse_comment("reboot after the driver update") is None
    assert parse_comment("gpu_failure: something; node=gpu1") is None
