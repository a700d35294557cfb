"""`gpupool top`'s pure parts: scontrol job details, exporter scrapes, and the rendered view.

Provenance of the inputs:

* fixtures/scontrol_show_job_details.txt is verbatim output of
  ``scontrol show job -d --oneliner`` (Slurm 22.05.8, the local one-node cluster)
  with five jobs of one account: 2 GPUs with a gpupool comment, no GPU, 1 GPU
  under a hostile name that spells allocation words, and an array of two 1-GPU
  tasks, one running and one pending on Resources.
* MULTI_NODE is that file's first line with its one ``Nodes=`` group replaced by
  two, written by hand in the format Slurm's ``_sprint_job_info`` prints for
  each group of identical nodes (``Nodes=<hostlist> CPU_IDs= Mem= GRES=``).
* fixtures/*.prom are written by hand in dcgm-exporter's and
  nvidia_gpu_exporter's output formats (this machine has no GPU to scrape);
  each file says so in its first lines.

Goldens live in tests/unit/golden_top/; ``GPUPOOL_UPDATE_GOLDEN=1`` rewrites them
(and still fails, so an update run never passes silently).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gpupool.gpu_usage.exporter import (
    GpuReading,
    MetricsParseError,
    NodeMetrics,
    node_metrics_from_text,
    parse_gpu_metrics,
)
from gpupool.slurm.detail import (
    GpusHeldOnNode,
    RunningJob,
    gpu_indices,
    parse_index_list,
    parse_job_records,
    parse_running_jobs,
)
from gpupool.slurm.parse import ParseError
from gpupool.slurm.report import parse_node_reasons
from gpupool_cli.main import build_parser
from gpupool_cli.top import render_top
from tests import golden

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
GOLDEN_DIR = HERE / "golden_top"  # not golden/: test_render owns every file there
NOW = dt.datetime(2026, 11, 29, 19, 17, 46, tzinfo=dt.UTC)

RECORDED = (FIXTURES / "scontrol_show_job_details.txt").read_text()
DCGM = (FIXTURES / "dcgm_exporter_vm.prom").read_text()
NVIDIA_SMI = (FIXTURES / "nvidia_gpu_exporter_gpu2.prom").read_text()
RECORDED_DETAIL = "Nodes=vm CPU_IDs=0 Mem=2000 GRES=gpu:rtx4090:2(IDX:0-1)"
MULTI_NODE = RECORDED.splitlines()[0].replace(
    RECORDED_DETAIL,
    "Nodes=gpu[01-02] CPU_IDs=0-7 Mem=32000 GRES=gpu:rtx3090:1(IDX:0) "
    "Nodes=gpu03 CPU_IDs=0-3 Mem=16000 GRES=gpu:rtx3090:2(IDX:0,2)",
)


def check_golden(name: str, actual: str) -> None:
    golden.check_golden(GOLDEN_DIR, name, actual)


# --- scontrol show job --details --oneliner ---------------------------------------------


def test_recorded_jobs_are_read_with_account_user_and_gpu_indices() -> None:
    assert RECORDED_DETAIL in RECORDED  # MULTI_NODE's substitution really happens
    assert parse_running_jobs(RECORDED) == [
        RunningJob(5, "5", "probetop", "root", (GpusHeldOnNode("vm", (0, 1)),)),
        RunningJob(6, "6", "probetop", "root", ()),  # no GPU: running, holds nothing
        RunningJob(7, "7", "probetop", "root", (GpusHeldOnNode("vm", (2,)),)),
        RunningJob(9, "8_0", "probetop", "root", (GpusHeldOnNode("vm", (3,)),)),
        # 8_1 is PENDING on Resources: not shown
    ]


def test_a_job_name_that_spells_allocation_words_changes_nothing() -> None:
    line = next(line for line in RECORDED.splitlines() if line.startswith("JobId=7 "))
    assert "Account=evil" in line and "GRES=gpu:4(IDX:0-3)" in line and "UserId=foo(0)" in line
    (job,) = parse_running_jobs(line)
    assert (job.account, job.user, job.gpus) == ("probetop", "root", (GpusHeldOnNode("vm", (2,)),))


def test_multi_node_jobs_hold_gpus_on_every_node_of_each_group() -> None:
    (job,) = parse_running_jobs(MULTI_NODE)
    assert job.gpus == (GpusHeldOnNode("gpu01", (0,)), GpusHeldOnNode("gpu02", (0,)), GpusHeldOnNode("gpu03", (0, 2)))
    assert job.gpu_count == 4


def test_a_newline_in_a_job_name_continues_the_job() -> None:
    text = RECORDED.replace("JobName=train-llm", "JobName=train\nllm")
    assert [(job.slurm_job_id, job.gpus) for job in parse_running_jobs(text)][:1] == [(5, (GpusHeldOnNode("vm", (0, 1)),))]
    assert [job.slurm_job_id for job in parse_running_jobs(text)] == [5, 6, 7, 9]


def test_a_whole_forged_line_in_a_jobs_text_makes_neither_record_believed() -> None:
    """Job 7's tenant writes a line for job 5 (another tenant's) on GPUs of its choosing, after a newline."""
    forged = (
        "WorkDir=/tmp\nJobId=5 JobName=train-llm UserId=root(0) Account=probetop JobState=RUNNING "
        "Nodes=vm CPU_IDs=0 Mem=1 GRES=gpu:rtx4090:2(IDX:2-3) MinCPUsNode=1 WorkDir=/x"
    )
    lines = RECORDED.splitlines()
    seventh = next(index for index, line in enumerate(lines) if line.startswith("JobId=7 "))
    assert "WorkDir=/tmp" in lines[seventh]
    lines[seventh] = lines[seventh].replace("WorkDir=/tmp", forged)
    records = parse_job_records("\n".join(lines))
    assert records.doubted == {5}
    assert [job.slurm_job_id for job in records.jobs] == [6, 7, 9]
    assert next(job for job in records.jobs if job.slurm_job_id == 7).gpus == (GpusHeldOnNode("vm", (2,)),)


def test_older_gres_idx_word_and_no_jobs() -> None:
    old = RECORDED.splitlines()[0].replace("GRES=gpu:rtx4090:2(IDX:0-1)", "GRES_IDX=gpu(IDX:1,3)")
    assert parse_running_jobs(old)[0].gpus == (GpusHeldOnNode("vm", (1, 3)),)
    assert parse_running_jobs("No jobs in the system\n") == []
    assert parse_running_jobs("") == []


@pytest.mark.parametrize(
    ("detail", "indices"),
    [
        ("gpu:rtx4090:2(IDX:0-1)", (0, 1)),
        ("gpu:3(IDX:0-1,3)", (0, 1, 3)),
        ("gpu:rtx4090:1(IDX:0),gpu:rtx3090:1(IDX:4)", (0, 4)),
        ("gpu:1(IDX:2),tmpdisk(CNT:10)", (2,)),
        ("gpu(CNT:2)", ()),  # a count without indices names no GPU
        ("", ()),
    ],
)
def test_gpu_indices_from_gres_detail(detail: str, indices: tuple[int, ...]) -> None:
    assert gpu_indices(detail) == indices


@pytest.mark.parametrize(
    "text",
    [
        "Unexpected banner\n" + RECORDED,
        "JobId=3 UserId=root(0) Account=a JobState=RUNNING\n",  # no JobName: not the format asked for
        RECORDED.splitlines()[0].replace(" Account=probetop", ""),
        RECORDED.splitlines()[0].replace("(IDX:0-1)", "(IDX:zero)"),
        RECORDED.splitlines()[0].replace("Nodes=vm ", "Nodes=vm[1-x] "),
    ],
)
def test_output_of_another_shape_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_running_jobs(text)


def test_index_lists() -> None:
    assert parse_index_list("0-2,5,7-8") == (0, 1, 2, 5, 7, 8)
    with pytest.raises(ParseError):
        parse_index_list("0-")


# --- exporter scrapes ---------------------------------------------------------------------


def test_dcgm_exporter_scrape() -> None:
    gpus = parse_gpu_metrics(DCGM)
    assert sorted(gpus) == [0, 1, 2, 3]
    assert gpus[0] == GpuReading(
        index=0, model="NVIDIA GeForce RTX 4090", utilization_pct=97.0, memory_used_mib=20480.0,
        memory_total_mib=24564.0, temperature_c=71.0, power_w=312.45,
    )
    assert gpus[3].utilization_pct == 88.0 and gpus[3].memory_used_mib == 23100.0


def test_nvidia_gpu_exporter_scrape_is_joined_on_uuid_and_converted() -> None:
    gpus = parse_gpu_metrics(NVIDIA_SMI)
    assert gpus == {
        0: GpuReading(0, "NVIDIA GeForce RTX 3090", 64.0, 15000.0, 24576.0, 67.0, 287.5),
        1: GpuReading(1, "NVIDIA GeForce RTX 3090", 0.0, 270.0, 24576.0, 31.0, 19.03),
    }


def test_reserved_memory_counts_towards_the_size_and_nan_is_unknown() -> None:
    text = (
        'DCGM_FI_DEV_FB_USED{gpu="1",modelName="m"} 100\n'
        'DCGM_FI_DEV_FB_FREE{gpu="1",modelName="m"} 800\n'
        'DCGM_FI_DEV_FB_RESERVED{gpu="1",modelName="m"} 124\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",modelName="m"} NaN\n'
        # A MIG instance of the same GPU: not the device's own numbers.
        'DCGM_FI_DEV_FB_USED{gpu="1",GPU_I_ID="3",modelName="m"} 5\n'
    )
    assert parse_gpu_metrics(text) == {1: GpuReading(1, "m", None, 100.0, 1024.0, None, None)}


def test_a_scrape_that_is_not_prometheus_text_is_an_error_for_that_node() -> None:
    with pytest.raises(MetricsParseError):
        parse_gpu_metrics("<html><body>Not Found</body></html>")
    node = node_metrics_from_text("vm", "<html>")
    assert node.gpus == {} and node.error is not None and "not Prometheus text" in node.error
    assert parse_gpu_metrics("# nothing here\n") == {}


# --- the view ------------------------------------------------------------------------------


def test_view_of_the_recorded_cluster() -> None:
    view = render_top(parse_running_jobs(RECORDED)[::-1], {"vm": node_metrics_from_text("vm", DCGM)}, now=NOW)
    check_golden("top-vm.txt", view)
    assert view.splitlines()[0] == "gpupool top  2026-11-29 19:17:46 UTC  3 jobs running on 4 GPU(s)"
    job5_gpu0 = next(line.split() for line in view.splitlines() if line.startswith("5 "))
    assert job5_gpu0 == ["5", "probetop", "root", "vm", "0", "97%", "20.0/24.0", "GiB", "71C", "312W",
                         "NVIDIA", "GeForce", "RTX", "4090"]


def test_view_with_an_unreachable_exporter_and_gpus_no_job_holds() -> None:
    jobs = [job for job in parse_running_jobs(MULTI_NODE)]
    metrics = {
        "gpu01": node_metrics_from_text("gpu01", NVIDIA_SMI),
        "gpu02": NodeMetrics("gpu02", error="http://gpu02:9400/metrics: [Errno 111] Connection refused"),
        # gpu03: never scraped
    }
    view = render_top(jobs, metrics, now=NOW)
    check_golden("top-multinode.txt", view)
    rows = [line.split() for line in view.splitlines()[3:] if line and not line.startswith("gpu02:")]
    assert [row[:5] for row in rows] == [
        ["5", "probetop", "root", "gpu01", "0"],
        ["5", "probetop", "root", "gpu02", "0"],
        ["5", "probetop", "root", "gpu03", "0"],
        ["5", "probetop", "root", "gpu03", "2"],
        ["-", "-", "-", "gpu01", "1"],  # reported by the exporter, held by no job
    ]
    assert rows[1][5:] == ["n/a", "n/a", "n/a", "n/a"]
    assert rows[2][5:] == ["n/a", "n/a", "n/a", "n/a"]
    assert view.endswith("\ngpu02: GPU metrics n/a: http://gpu02:9400/metrics: [Errno 111] Connection refused\n")


def test_goldens_have_no_strays() -> None:
    assert {path.name for path in GOLDEN_DIR.iterdir()} == {"top-vm.txt", "top-multinode.txt"}


def test_names_reach_the_terminal_without_control_characters() -> None:
    job = RunningJob(1, "1", "acme", "root", (GpusHeldOnNode("vm", (0,)),))
    hostile = NodeMetrics("vm", {0: GpuReading(0, model="\x1b[2Jevil\x07")})
    view = render_top([job], {"vm": hostile}, now=NOW)
    assert "\x1b" not in view and "\x07" not in view and "?[2Jevil?" in view


# --- the command line ------------------------------------------------------------------------


def test_top_options(tmp_path: Path) -> None:
    scrape = tmp_path / "vm.prom"
    scrape.write_text(DCGM)
    args = build_parser().parse_args(["top", "--once", "--metrics-file", f"vm={scrape}", "--interval", "0.5"])
    assert (args.once, args.interval, args.metrics_file) == (True, 0.5, [("vm", scrape)])
    assert build_parser().parse_args(["top"]).interval == 3.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["top", "--interval", "0"], "must be more than 0 seconds"),
        (["top", "--interval", "soon"], "is not a number of seconds"),
        (["top", "--metrics-file", "vm"], "is not NODE=FILE"),
        (["top", "--metrics-file", "vm=/nonexistent/scrape.prom"], "no such file"),
    ],
)
def test_bad_top_options_exit_2_with_a_message(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_record_cut_short_by_a_forged_line_is_skipped_alone() -> None:
    """A name with a newline and a line that is no whole record: that record is skipped, and no other."""
    lines = RECORDED.splitlines()
    seventh = next(index for index, line in enumerate(lines) if line.startswith("JobId=7 "))
    lines[seventh] = lines[seventh].replace("JobName=x ", "JobName=x\nJobId=5 JobName=cut short\n", 1)
    records = parse_job_records("\n".join(lines))
    assert [job.slurm_job_id for job in records.jobs] == [6, 9]  # 7 cut short, 5 printed twice (the forged one takes the rest of 7)
    assert records.doubted == {5} and [text.split(":")[0] for text in records.unreadable] == ["'JobId=7 JobName=x'"]
    with pytest.raises(ParseError, match="no scontrol job line could be read"):
        parse_job_records("JobId=3 JobName=x\nJobId=4 JobName=y\n")


# --- nodes out of service ----------------------------------------------------------------------

# sinfo --json's nodes as Slurm 22.05 prints them (state and state_flags apart; a node once per partition),
# and as 23.02 and later do (state a list, reason_changed_at a {set, number} object).
SINFO_2205 = (
    '{"meta": {}, "nodes": ['
    '{"name": "gpu1", "state": "mixed", "state_flags": ["DRAIN"], "reason": "gpu: Xid 79 on 0000:41:00.0",'
    ' "reason_changed_at": 1796425200, "reason_set_by_user": "root"},'
    '{"name": "gpu1", "state": "mixed", "state_flags": ["DRAIN"], "reason": "gpu: Xid 79 on 0000:41:00.0",'
    ' "reason_changed_at": 1796425200},'
    '{"name": "gpu2", "state": "idle", "state_flags": [], "reason": "", "reason_changed_at": 0}]}'
)
SINFO_2302 = (
    '{"nodes": [{"name": "gpu3", "state": ["DOWN", "NOT_RESPONDING"], "reason": "Not responding",'
    ' "reason_changed_at": {"set": true, "infinite": false, "number": 1796428800}}]}'
)


def test_sinfo_json_of_either_shape_gives_each_node_once_with_its_reason() -> None:
    nodes = parse_node_reasons(SINFO_2205) + parse_node_reasons(SINFO_2302)

    assert [(n.name, n.state, n.out_of_service, n.reason) for n in nodes] == [
        ("gpu1", "MIXED+DRAIN", True, "gpu: Xid 79 on 0000:41:00.0"),
        ("gpu2", "IDLE", False, ""),
        ("gpu3", "DOWN+NOT_RESPONDING", True, "Not responding"),
    ]
    assert nodes[0].reason_changed_at == dt.datetime(2026, 12, 4, 23, 0, tzinfo=dt.UTC)
    assert nodes[1].reason_changed_at is None
    with pytest.raises(ParseError):
        parse_node_reasons('{"jobs": []}')


def test_a_drained_node_is_shown_below_the_table_with_its_reason() -> None:
    nodes = parse_node_reasons(SINFO_2205) + parse_node_reasons(SINFO_2302)

    view = render_top([], {}, now=NOW, nodes=nodes)

    assert view.endswith(
        "\nOut of service:\n"
        "  gpu1: mixed+drain since 2026-12-04 23:00 UTC: gpu: Xid 79 on 0000:41:00.0\n"
        "  gpu3: down+not_responding since 2026-12-05 00:00 UTC: Not responding\n"
    )
