"""Job arrays and sweeps, in their pure parts: rendering, the run-as helper's checks,
the job-id grammar of squeue and sacct rows, the job's state made from its tasks',
and which job a billed task run belongs to.

The sweep values are run through the rendered script with bash, as the job runs it,
from the files the run-as helper's own writer makes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from billing.passes import _array_job_id
from billing.sacct import RunReader
from gpupool.config import Settings
from gpupool.errors import TenantError
from gpupool.jobstate import array_state
from gpupool.render import ARRAY_VALUES_DIR, ArraySpec, JobSpec, param_env_name, render
from gpupool.slurm.client import parse_accounting, parse_queue
from gpupool.slurm.parse import ArrayJobId, ParseError, parse_array_job_id
from gpupool.slurm.runas.checks import array_size, cancel_target, check_array_values, check_script, check_submit_options
from gpupool.slurm.runas.engine import DirectTenantActions
from gpupool.slurm.tenants import Tenant

JOB_ID = "0b0e4c8e-8a8f-4a2b-9a59-0f6b3c1d2e4f"
JOB_DIR = Path("/var/lib/gpupool/jobs/acme") / JOB_ID
SETTINGS = Settings(service_user="gpupool", service_group="gpupool", job_root="/var/lib/gpupool/jobs", slurm_partition="gpu")
# The hostile strings, and more of the same kind: each must reach its task byte for byte.
HOSTILE = (
    "a'; echo foo",
    "a\n0",
    "$(touch SENTINEL)",
    "`touch SENTINEL`",
    '"; touch SENTINEL; "',
    "x\n#SBATCH --account=evil\n",
    "  leading and trailing blanks  ",
    "trailing newlines\n\n",
    "back\\slash \\n not a newline",
    "-n",
    "",
    "unicode: ünï 雪 \u2028",
)
PRINT_BODY = "printf '%s' \"$GPUPOOL_PARAM_MESSAGE\"\n"


def spec(array: ArraySpec | None, job_dir: str = str(JOB_DIR), **changes: object) -> JobSpec:
    values: dict[str, object] = {
        "job_id": JOB_ID, "account": "acme", "name": "sweep", "template": "hello", "body": PRINT_BODY,
        "params": {"seconds": 0}, "gpus": 1, "gpu_type": None, "cpus": 1, "mem_gb": 4, "time_limit_min": 5,
        "partition": "gpu", "job_dir": job_dir, "array": array,
    }
    values.update(changes)
    return JobSpec(**values)  # type: ignore[arg-type]


def check(options: list[str] | tuple[str, ...], settings: Settings = SETTINGS) -> list[str]:
    return check_submit_options(settings, list(options), "acme", JOB_ID)


# --- rendering ---------------------------------------------------------------------------


def test_array_option_and_per_task_logs() -> None:
    options = render(spec(ArraySpec(count=20, max_parallel=2))).options
    assert "--array=0-19%2" in options
    assert f"--output={JOB_DIR}/stdout-%a.log" in options
    assert f"--error={JOB_DIR}/stderr-%a.log" in options
    # In the fixed order: after the time limit (and whether Slurm may requeue it), before the folder.
    assert options.index("--array=0-19%2") == options.index("--no-requeue") + 1 == options.index("--time=5") + 2
    assert "--array=0-4" in render(spec(ArraySpec(count=5))).options


def test_a_single_job_has_no_array_option() -> None:
    options = render(spec(None)).options
    assert not any(option.startswith("--array") for option in options)
    assert f"--output={JOB_DIR}/stdout.log" in options


def test_sweep_values_are_never_in_the_script() -> None:
    values = tuple(value.replace("SENTINEL", "/tmp/x") for value in HOSTILE if value)
    rendered = render(spec(ArraySpec(len(values), 2, "message", values)))
    assert rendered.array_values == values
    for value in values:
        if len(value.strip()) > 3:
            assert value not in rendered.script
    assert f"IFS= read -r -d '' {param_env_name('message')} <&3 || true" in rendered.script
    # The checked script passes the helper's #SBATCH reader with its own options.
    check_script(rendered.script, check(rendered.options))


def test_a_swept_param_cannot_also_have_a_value() -> None:
    with pytest.raises(ValueError, match="swept"):
        render(spec(ArraySpec(1, None, "message", ("a",)), params={"message": "b", "seconds": 0}))


@pytest.mark.parametrize(
    "shape",
    [dict(count=0), dict(count=2, max_parallel=0), dict(count=2, sweep_param="m", sweep_values=("a",)),
     dict(count=1, sweep_param="m"), dict(count=1, sweep_values=("a",))],
)
def test_array_spec_refuses_bad_shapes(shape: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ArraySpec(**shape)  # type: ignore[arg-type]


def _tenant_actions_write(job_dir: Path, values: list[str]) -> None:
    """The run-as helper's own writer, as the current user (who is then the tenant)."""
    tenant = Tenant(account="acme", user="me", uid=os.getuid(), gid=os.getgid())
    DirectTenantActions(SETTINGS)._write_array_values(job_dir, values, tenant)


def test_hostile_sweep_values_reach_each_task_verbatim(tmp_path: Path) -> None:
    sentinel = tmp_path / f"pwned-{uuid.uuid4().hex}"
    values = [value.replace("SENTINEL", str(sentinel)) for value in HOSTILE]
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    rendered = render(spec(ArraySpec(len(values), 2, "message", tuple(values)), job_dir=str(job_dir)))
    assert rendered.array_values is not None
    _tenant_actions_write(job_dir, list(rendered.array_values))
    script = job_dir / "job.sbatch"
    script.write_text(rendered.script)
    for index, value in enumerate(values):
        result = subprocess.run(
            ["/bin/bash", str(script)], capture_output=True, cwd=job_dir, timeout=30, check=False,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "HOME": str(tmp_path), "SLURM_ARRAY_TASK_ID": str(index)},
        )
        assert (result.returncode, result.stderr) == (0, b"")
        assert result.stdout == value.encode("utf-8"), index
    assert not sentinel.exists()
    assert (job_dir / ARRAY_VALUES_DIR / "1").read_bytes() == b"a\n0"


def test_a_task_without_its_value_file_stops(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    rendered = render(spec(ArraySpec(2, None, "message", ("a", "b")), job_dir=str(job_dir)))
    _tenant_actions_write(job_dir, ["a", "b"])
    script = job_dir / "job.sbatch"
    script.write_text(rendered.script)
    for task_id, expected in (("7", "No such file"), (None, "not started as an array task")):
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"} | ({"SLURM_ARRAY_TASK_ID": task_id} if task_id else {})
        result = subprocess.run(["/bin/bash", str(script)], capture_output=True, text=True, env=env, check=False)
        assert result.returncode != 0
        assert expected in result.stderr
        assert result.stdout == ""


def test_docker_array_tasks_get_their_index_in_the_container() -> None:
    script = render(
        spec(ArraySpec(2, None, "message", ("a", "b")), runtime="docker", container_image="nvcr.io#nvidia/pytorch:24.01-py3")
    ).script
    for name in ("GPUPOOL_PARAM_MESSAGE", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_JOB_ID"):
        assert f"  --env {name} \\" in script


# --- the run-as helper --------------------------------------------------------------------


def test_the_helper_takes_the_renderers_array_options() -> None:
    options = render(spec(ArraySpec(20, 2))).options
    assert check(options) == list(options)


@pytest.mark.parametrize(
    "value",
    ["1-19", "0-19%0", "0-19:2", "0,1,2", "0-019", "0-19%2%2", "0-", "0-1001", "0-999999", " 0-3", "0-3\n", "0-3%02"],
)
def test_the_helper_refuses_other_array_values(value: str) -> None:
    options = [o if not o.startswith("--array=") else f"--array={value}" for o in render(spec(ArraySpec(4))).options]
    with pytest.raises(TenantError):
        check(options)


def test_array_size_is_bounded_by_the_operator() -> None:
    assert array_size(SETTINGS, "0-999%5") == 1000
    with pytest.raises(TenantError, match="at most 10"):
        array_size(dataclasses.replace(SETTINGS, max_array_tasks=10), "0-10")


def test_an_array_writes_per_task_logs_and_a_single_job_does_not() -> None:
    array_options = list(render(spec(ArraySpec(4))).options)
    single = [o for o in array_options if not o.startswith("--array=")]
    with pytest.raises(TenantError, match="--output"):
        check(single)  # the %a pattern without --array
    plain = list(render(spec(None)).options)
    with pytest.raises(TenantError, match="--output"):
        check([*plain[:9], "--array=0-3", *plain[9:]])  # --array with one shared log


@pytest.mark.parametrize("bare", ["--array", "-a", "--array=0-3 --account=evil"])
def test_the_helper_refuses_array_spellings(bare: str) -> None:
    options = [*render(spec(None)).options, bare]
    with pytest.raises(TenantError):
        check(options)


def test_an_array_directive_the_command_line_lacks_is_refused() -> None:
    rendered = render(spec(None))
    script = rendered.script.replace("#SBATCH --ignore-pbs", "#SBATCH --ignore-pbs\n#SBATCH --array=0-999")
    with pytest.raises(TenantError, match="--array=0-999"):
        check_script(script, check(rendered.options))


def test_array_values_are_checked() -> None:
    assert check_array_values(["a", "b"], 2) == ["a", "b"]
    assert check_array_values(None, 2) is None
    for values, count, message in (
        (["a"], 2, "takes 2"), (["a", "b"], None, "array job"), (["a\x00"], 1, "NUL"), ([1], 1, "strings"),
        (["\ud800"], 1, "UTF-8"),
    ):
        with pytest.raises(TenantError, match=message):
            check_array_values(values, count)  # type: ignore[arg-type]


@pytest.mark.parametrize(("target", "ok"), [(123, True), ("123_4", True), ("123_0", True), ("123", False),
                                             ("123_4 --user=x", False), ("-1_2", False), ("123_04", False), (True, False),
                                             (0, False), ("123_[1-2]", False)])
def test_scancel_targets(target: object, ok: bool) -> None:
    assert cancel_target(target) is ok


# --- the job-id grammar ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("123", None), ("123+0", None), ("123_4", ArrayJobId(123, (4,))), ("123_[5-7]", ArrayJobId(123, (5, 6, 7), True)),
     ("123_[5-7%2]", ArrayJobId(123, (5, 6, 7), True)), ("123_[1,3-4,9%1]", ArrayJobId(123, (1, 3, 4, 9), True)),
     ("123_[4]", ArrayJobId(123, (4,), True))],
)
def test_array_job_ids(text: str, expected: ArrayJobId | None) -> None:
    assert parse_array_job_id(text) == expected


@pytest.mark.parametrize("text", ["123_[5-...", "123_[7-5]", "123_", "abc", "123_[0-999999]", "123_4_5"])
def test_array_job_ids_that_are_neither(text: str) -> None:
    with pytest.raises(ParseError):
        parse_array_job_id(text)


D = "|0123456789ab|"
QUEUE_HEADER = D.join(("JOBID", "STATE", "REASON", "SUBMIT_TIME", "START_TIME", "END_TIME", "NODELIST", "USER", "ACCOUNT", "COMMENT"))


def queue_row(job_id: str, state: str, start: str = "2026-12-02T04:00:01", comment: str = "gpupool:x") -> str:
    return D.join((job_id, state, "None", "2026-12-02T04:00:00", start, "N/A", "node1", "gp-acme", "acme", comment))


def test_squeue_array_rows_are_tasks_not_jobs() -> None:
    text = "\n".join((
        QUEUE_HEADER, queue_row("100", "RUNNING"), queue_row("101_0", "RUNNING"), queue_row("101_1", "RUNNING"),
        queue_row("101_[2-4%2]", "PENDING", start="N/A"), queue_row("102+0", "RUNNING"),
    )) + "\n"
    rows = parse_queue(text, D)
    assert sorted(rows) == [100]
    assert sorted(rows.tasks) == [101]
    assert {index: entry.state for index, entry in rows.tasks[101].items()} == {
        0: "RUNNING", 1: "RUNNING", 2: "PENDING", 3: "PENDING", 4: "PENDING"
    }
    assert rows.tasks[101][3].started_at is None and rows.tasks[101][3].array_task == 3
    assert rows.tasks[101][0].slurm_job_id == 101 and rows.tasks[101][0].comment == "gpupool:x"
    assert rows.refused == ()


def test_a_task_listed_twice_is_not_believed() -> None:
    text = "\n".join((QUEUE_HEADER, queue_row("101_2", "RUNNING"), queue_row("101_2", "PENDING", start="N/A"),
                      queue_row("101_3", "RUNNING"))) + "\n"
    rows = parse_queue(text, D)
    assert list(rows.tasks[101]) == [3]
    assert len(rows.refused) == 1 and "101_2 listed again" in rows.refused[0]


@pytest.mark.parametrize("own_row_first", [True, False])
def test_a_tasks_own_row_outranks_a_stale_pending_record(own_row_first: bool) -> None:
    # slurmdbd updates the array's pending record after it splits a task off: sacct shows 201_2 in both.
    rows_text = [acct_row("205", "201_2", "COMPLETED"), acct_row("201", "201_[2-4%2]", "PENDING", start="None")]
    text = "\n".join((D.join(ACCT_FIELDS), *(rows_text if own_row_first else rows_text[::-1]))) + "\n"
    rows = parse_accounting(text, D)
    assert {index: (entry.slurm_job_id, entry.state) for index, entry in rows.tasks[201].items()} == {
        2: (205, "COMPLETED"), 3: (201, "PENDING"), 4: (201, "PENDING")
    }
    assert rows.refused == ()


def test_a_truncated_pending_range_is_refused_alone() -> None:
    text = "\n".join((QUEUE_HEADER, queue_row("100", "RUNNING"), queue_row("101_[2-3,5,7,9,1...", "PENDING"))) + "\n"
    rows = parse_queue(text, D)
    assert sorted(rows) == [100] and rows.tasks == {}
    assert "not a Slurm job id" in rows.refused[0]


ACCT_FIELDS = ("JobIDRaw", "JobID", "State", "ExitCode", "Submit", "Start", "End", "ElapsedRaw", "NodeList", "Reason", "User", "Account")


def acct_row(raw: str, job_id: str, state: str, exit_code: str = "0:0", start: str = "2026-12-02T04:00:01") -> str:
    end = "2026-12-02T04:00:03" if state not in ("PENDING", "RUNNING") else "Unknown"
    return D.join((raw, job_id, state, exit_code, "2026-12-02T04:00:00", start, end, "2", "node1", "None", "gp-acme", "acme"))


def test_sacct_array_rows_keep_their_own_ids() -> None:
    text = "\n".join((
        D.join(ACCT_FIELDS), acct_row("200", "200", "COMPLETED"), acct_row("203", "201_0", "COMPLETED"),
        acct_row("204", "201_1", "FAILED", "3:0"), acct_row("201", "201_[2-3]", "CANCELLED by 1000", start="None"),
    )) + "\n"
    rows = parse_accounting(text, D)
    assert sorted(rows) == [200]
    tasks = rows.tasks[201]
    assert {index: (entry.slurm_job_id, entry.state, entry.exit_code) for index, entry in tasks.items()} == {
        0: (203, "COMPLETED", 0), 1: (204, "FAILED", 3), 2: (201, "CANCELLED", 0), 3: (201, "CANCELLED", 0)
    }
    assert tasks[1].array_job_id == 201 and tasks[1].ended_at == dt.datetime(2026, 12, 2, 4, 0, 3, tzinfo=dt.UTC)


# --- the job's state from its tasks' -----------------------------------------------------


@pytest.mark.parametrize(
    ("states", "expected"),
    [(["PENDING", "RUNNING", "COMPLETED"], "RUNNING"), (["PENDING", "COMPLETED"], "PENDING"),
     (["COMPLETED", "COMPLETED"], "COMPLETED"), (["COMPLETED", "CANCELLED", "FAILED"], "CANCELLED"),
     (["COMPLETING", "COMPLETED"], "RUNNING")],
)
def test_array_state(states: list[str], expected: str) -> None:
    assert array_state(states) == expected


# --- billing: a task's run belongs to its array's job -------------------------------------


def test_task_runs_name_their_array() -> None:
    header = "Cluster|JobIDRaw|JobID|Account|User|State|Submit|Start|End|ElapsedRaw|AllocTRES|JobName"
    rows = [
        "c|300|300|acme|gp-acme|COMPLETED|2026-12-02T04:00:00|2026-12-02T04:00:01|2026-12-02T04:00:03|2|gres/gpu=1|n",
        "c|305|301_0|acme|gp-acme|COMPLETED|2026-12-02T04:00:00|2026-12-02T04:00:01|2026-12-02T04:00:03|2|gres/gpu=1|n",
        "c|301|301_1|acme|gp-acme|COMPLETED|2026-12-02T04:00:00|2026-12-02T04:00:01|2026-12-02T04:00:03|2|gres/gpu=1|n",
    ]
    reader = RunReader("\n".join((header, *rows)) + "\n", "|")
    assert reader.array_job_ids() == {301}
    runs = list(reader.runs())
    assert [(run.job_id_raw, run.job_id, _array_job_id(run)) for run in runs] == [
        (300, "300", None), (305, "301_0", 301), (301, "301_1", 301)
    ]
