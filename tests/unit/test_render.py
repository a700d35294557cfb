"""render(): golden files, option order, and hostile parameter values.

Golden files live in tests/unit/golden/. To regenerate them after an intended
change, run

    GPUPOOL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_render.py

review the diff, and run again without the variable. A golden that differs
fails the test in both modes, so an update run never passes silently.

Hostile values are not only inspected: the rendered script is run with bash
(with a body that just prints the parameter), and its directives are read the
way sbatch 22.05 reads them (src/sbatch/opt.c: ``_opt_batch_script``,
``_opt_wrpr_batch_script``, ``_get_argument``), so a value that would smuggle
an option to sbatch fails here.
"""

from __future__ import annotations

import dataclasses
import shlex
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpupool.errors import ValidationFailed
from gpupool.render import (
    ArraySpec,
    JobSpec,
    RenderedJob,
    gres,
    log_path,
    render,
    sbatch_options,
    session_shim_source,
    shell_quote,
)
from gpupool.templates import Template
from tests import golden

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"

IMAGE = "nvcr.io#nvidia/pytorch:24.01-py3"
OPERATOR_MOUNT = "/datasets:/datasets:ro"
DATA_DIR = "/var/lib/gpupool/data/acme"
JOB_ID = "j-0123456789abcdef"
JOB_DIR = f"/var/lib/gpupool/jobs/{JOB_ID}"
RUNTIMES = ("none", "pyxis", "docker")

# The body used to run hostile values: print the parameter, byte for byte, nothing else.
PRINT_MESSAGE_BODY = "printf '%s' \"$GPUPOOL_PARAM_MESSAGE\"\n"

BASH = "/bin/bash"


def make_spec(loaded: Template, runtime: str = "none", **changes: object) -> JobSpec:
    """The spec the goldens are made from; ``changes`` overrides any field."""
    fields: dict[str, object] = dict(
        job_id=JOB_ID,
        account="acme",
        name="hello world",
        template="hello",
        body=loaded.body,
        gpus=2,
        gpu_type="rtx4090",
        cpus=4,
        mem_gb=16,
        time_limit_min=30,
        partition="gpu",
        job_dir=JOB_DIR,
        runtime=runtime,
        container_image=None if runtime == "none" else IMAGE,
        container_mounts=() if runtime == "none" else (OPERATOR_MOUNT,),
        data_dir=DATA_DIR,
    )
    fields.update(changes)
    if "params" not in fields:  # validated only when not replaced: other templates take other params
        fields["params"] = loaded.validate_params({"message": "hi there", "seconds": 3})
    return JobSpec(**fields)  # type: ignore[arg-type]


# --- a model of how sbatch 22.05 reads a batch script ----------------------------------

_C_SPACE = " \t\n\v\f\r"  # C isspace() in the C locale


def sbatch_line_arguments(text: str) -> list[str]:
    """The arguments sbatch's ``_get_argument`` loop takes from the rest of a directive line.

    Backslash escapes the next character, '...' and "..." group, an unquoted '#'
    ends the line, an unmatched quote is fatal (sbatch exits), and a leading ':'
    is fatal too.
    """
    args: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _C_SPACE:
            i += 1
        if i >= n:
            return args
        if text[i] == ":":
            raise ValueError(f"sbatch: Unexpected `:` in [{text}]")
        arg: list[str] = []
        quoted, q_char, escaped, comment = False, "", False, False
        while i < n and (quoted or text[i] not in _C_SPACE) and text[i] != "\n":
            char = text[i]
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
                i += 1
                continue
            elif quoted:
                if char == q_char:
                    quoted = False
                    i += 1
                    continue
            elif char in "\"'":
                quoted, q_char = True, char
                i += 1
                continue
            elif char == "#":
                comment = True
                break
            arg.append(char)
            i += 1
        if quoted:
            raise ValueError(f"sbatch: Unmatched `{q_char}` in [{text}]")
        if not arg:
            return args
        args.append("".join(arg))
        if comment:
            return args


def sbatch_script_directives(script: str) -> list[str]:
    """Arguments of the #SBATCH / #SLURM lines sbatch reads: those before the first command."""
    args: list[str] = []
    for line in script.split("\n"):
        if line.startswith("#SBATCH"):
            args += sbatch_line_arguments(line[len("#SBATCH"):])
        elif line.startswith("#SLURM"):
            args += sbatch_line_arguments(line[len("#SLURM"):])
        else:
            stripped = line.lstrip(_C_SPACE)
            if stripped and not stripped.startswith("#"):
                break
    return args


def sbatch_wrapper_directives(script: str, argv: Sequence[str]) -> list[str]:
    """Arguments sbatch takes from #BSUB / #PBS lines, which it reads *anywhere* in the
    first hundred non-comment lines, unless ``--ignore-pbs`` is on its command line."""
    if "--ignore-pbs" in argv:
        return []
    for magic in ("#BSUB", "#PBS"):
        args: list[str] = []
        found, non_comments = False, 0
        for line in script.split("\n"):
            if not line.startswith(magic):
                if not line.startswith("#"):
                    non_comments += 1
                if non_comments > 100:
                    break
                continue
            found = True
            args += sbatch_line_arguments(line[len(magic):])
        if found:
            return args
    return []


def expected_script_directives(rendered: RenderedJob) -> list[str]:
    return [opt for opt in rendered.options if not opt.startswith("--job-name=")]


def lines_after_first_command(script: str) -> list[str]:
    lines = script.split("\n")
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return lines[index:]
    return []


# --- golden files ----------------------------------------------------------------------


def check_golden(name: str, actual: str) -> None:
    golden.check_golden(GOLDEN_DIR, name, actual)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_golden_script(hello: Template, runtime: str) -> None:
    rendered = render(make_spec(hello, runtime))
    check_golden(f"hello-{runtime}.sbatch", rendered.script)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_golden_options(hello: Template, runtime: str) -> None:
    rendered = render(make_spec(hello, runtime))
    assert all("\n" not in opt for opt in rendered.options)
    check_golden(f"hello-{runtime}.options", "".join(opt + "\n" for opt in rendered.options))


# Session templates, as the README's examples run them: golden name -> template, params, pyxis image (None: on the host).
SESSION_GOLDENS: dict[str, tuple[str, dict[str, str], str | None]] = {
    "jupyter-none": ("jupyter", {}, None),
    "jupyter-pyxis": ("jupyter", {}, IMAGE),
    "webapp-none": ("webapp", {"command": 'exec python3 -m http.server --bind 127.0.0.1 "$GPUPOOL_APP_PORT"'}, None),
    "webapp-comfyui-pyxis": (
        "webapp",
        {"command": 'cd /opt/ComfyUI && exec python main.py --listen 127.0.0.1 --port "$GPUPOOL_APP_PORT" '
                    '--output-directory "$GPUPOOL_DATA/comfyui/output" --input-directory "$GPUPOOL_DATA/comfyui/input"'},
        "ghcr.io#ai-dock/comfyui:latest",
    ),
    "webapp-sdwebui-pyxis": (
        "webapp",
        {"command": 'cd /opt/stable-diffusion-webui && exec ./webui.sh --server-name 127.0.0.1 --port "$GPUPOOL_APP_PORT"'},
        "ghcr.io#ai-dock/stable-diffusion-webui:latest",
    ),
}
SESSION_PORTS = "20000-29999"


@pytest.mark.parametrize("golden_name", sorted(SESSION_GOLDENS))
def test_golden_session_script(shipped_templates: dict[str, Template], golden_name: str) -> None:
    name, params, image = SESSION_GOLDENS[golden_name]
    template = shipped_templates[name]
    spec = make_spec(
        template, "none" if image is None else "pyxis", template=name, params=template.validate_params(params),
        session_ports=SESSION_PORTS, container_image=image,
    )
    rendered = render(spec)
    check_golden(f"{golden_name}.sbatch", rendered.script)
    # The shim travels inside the script, byte for byte, and the secret never does.
    assert session_shim_source() in rendered.script
    assert "secret" not in "".join(line for line in rendered.script.splitlines() if line.startswith("export "))


# The command template, as the customer guide's example runs it: on the host, and in a container (storage at /data).
COMMAND_GOLDENS: dict[str, str | None] = {"command-none": None, "command-pyxis": IMAGE}
COMMAND_LINE = 'python "$GPUPOOL_DATA/train.py" --out "$GPUPOOL_OUTPUT_DIR/run1"'


@pytest.mark.parametrize("golden_name", sorted(COMMAND_GOLDENS))
def test_golden_command_script(shipped_templates: dict[str, Template], golden_name: str) -> None:
    template, image = shipped_templates["command"], COMMAND_GOLDENS[golden_name]
    spec = make_spec(
        template, "none" if image is None else "pyxis", template="command",
        params=template.validate_params({"command": COMMAND_LINE}), container_image=image,
    )
    rendered = render(spec)
    check_golden(f"{golden_name}.sbatch", rendered.script)
    assert sbatch_script_directives(rendered.script) == expected_script_directives(rendered)


def test_command_template_runs_the_customers_line_as_written(shipped_templates: dict[str, Template], tmp_path: Path) -> None:
    # Quotes, a directive, a substitution and a second line: structure to bash, data to gpupool's script.
    line = (
        "printf '%s|' \"$GPUPOOL_TEMPLATE\" 'it''s' > \"$GPUPOOL_OUTPUT_DIR/seen\"\n"
        "#SBATCH --account=evil\n"
        "echo \"$(echo sub)\" >> \"$GPUPOOL_OUTPUT_DIR/seen\"; exit 7"
    )
    template = shipped_templates["command"]
    rendered = render(make_spec(template, template="command", params=template.validate_params({"command": line}), job_dir=str(tmp_path)))
    assert sbatch_script_directives(rendered.script) == expected_script_directives(rendered)
    script = tmp_path / "job.sbatch"
    script.write_text(rendered.script)
    ran = subprocess.run(["/bin/bash", str(script)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False, timeout=30)
    assert ran.returncode == 7, ran.stderr  # the command's own exit status is the job's
    assert (tmp_path / "output" / "seen").read_text() == "command|its|sub\n"


# A sweep of hello's message over three values, at most two tasks at once.
SWEEP = ArraySpec(count=3, max_parallel=2, sweep_param="message", sweep_values=("a'; echo foo", "a\n0", "$(touch /tmp/x)"))
SWEEP_RUNTIMES = ("none", "docker")


@pytest.mark.parametrize("runtime", SWEEP_RUNTIMES)
def test_golden_sweep(hello: Template, runtime: str) -> None:
    rendered = render(make_spec(hello, runtime, params={"seconds": 3}, array=SWEEP))
    check_golden(f"hello-sweep-{runtime}.sbatch", rendered.script)
    check_golden(f"hello-sweep-{runtime}.options", "".join(opt + "\n" for opt in rendered.options))
    assert rendered.array_values == SWEEP.sweep_values


@pytest.mark.parametrize("runtime", ["none", "pyxis"])
def test_golden_spot_job(hello: Template, runtime: str) -> None:
    rendered = render(make_spec(hello, runtime, preemptible=True))
    check_golden(f"hello-spot-{runtime}.sbatch", rendered.script)
    check_golden(f"hello-spot-{runtime}.options", "".join(opt + "\n" for opt in rendered.options))
    # The spot options sit right after --time, and nothing else differs from the full-price job.
    full = render(make_spec(hello, runtime)).options
    assert [opt for opt in rendered.options if opt not in full] == ["--qos=spot", "--requeue", "--signal=B:TERM@30", "--open-mode=append"]
    assert [opt for opt in full if opt not in rendered.options] == ["--no-requeue"]
    assert rendered.options.index("--qos=spot") == full.index(next(o for o in full if o.startswith("--time="))) + 1
    assert sbatch_script_directives(rendered.script) == expected_script_directives(rendered)


@pytest.mark.parametrize("runtime", ["none", "pyxis"])
def test_golden_requeue_on_failure_job(hello: Template, runtime: str) -> None:
    rendered = render(make_spec(hello, runtime, requeue_on_failure=True))
    check_golden(f"hello-requeue-{runtime}.sbatch", rendered.script)
    check_golden(f"hello-requeue-{runtime}.options", "".join(opt + "\n" for opt in rendered.options))
    # In --no-requeue's place: --requeue (squeue --json's requeue, which the GPU check reads), logs appended.
    full = render(make_spec(hello, runtime)).options
    time_at = full.index(next(o for o in full if o.startswith("--time=")))
    assert full[time_at + 1] == "--no-requeue"
    assert rendered.options == (*full[: time_at + 1], "--requeue", "--open-mode=append", *full[time_at + 2:])
    # Spot's wrapper (which waits out a preemption's SIGTERM) is not there: the body runs as a full-price job's.
    assert rendered.script.replace("#SBATCH --requeue\n#SBATCH --open-mode=append\n", "#SBATCH --no-requeue\n") == render(
        make_spec(hello, runtime)
    ).script
    assert sbatch_script_directives(rendered.script) == expected_script_directives(rendered)
    # A spot job that also asks is a spot job: its options already requeue it.
    assert render(make_spec(hello, runtime, preemptible=True, requeue_on_failure=True)) == render(
        make_spec(hello, runtime, preemptible=True)
    )


def test_goldens_have_no_strays() -> None:
    expected = {f"hello-{runtime}.{ext}" for runtime in RUNTIMES for ext in ("sbatch", "options")}
    expected |= {f"hello-sweep-{runtime}.{ext}" for runtime in SWEEP_RUNTIMES for ext in ("sbatch", "options")}
    expected |= {f"hello-spot-{runtime}.{ext}" for runtime in ("none", "pyxis") for ext in ("sbatch", "options")}
    expected |= {f"hello-requeue-{runtime}.{ext}" for runtime in ("none", "pyxis") for ext in ("sbatch", "options")}
    expected |= {f"{name}.sbatch" for name in SESSION_GOLDENS}
    expected |= {f"{name}.sbatch" for name in COMMAND_GOLDENS}
    assert {path.name for path in GOLDEN_DIR.iterdir()} == expected


@pytest.mark.parametrize("value", ["x\n#SBATCH --account=evil", "$(touch /tmp/pwned)", "'; exit 3; '"])
def test_hostile_session_command_creates_no_sbatch_directive(shipped_templates: dict[str, Template], value: str) -> None:
    template = shipped_templates["webapp"]
    spec = make_spec(template, template="webapp", params=template.validate_params({"command": value}), session_ports=SESSION_PORTS)
    rendered = render(spec)
    assert sbatch_script_directives(rendered.script) == expected_script_directives(rendered)
    assert f"export GPUPOOL_PARAM_COMMAND={shell_quote(value)}" in rendered.script


# --- option order and shape ------------------------------------------------------------


BASE_FLAGS = [
    "--job-name",
    "--account",
    "--partition",
    "--nodes",
    "--ntasks",
    "--cpus-per-task",
    "--mem",
    "--gres",
    "--time",
    "--no-requeue",
    "--chdir",
    "--output",
    "--error",
    "--comment",
]
CONTAINER_FLAGS = [
    "--container-image",
    "--container-mounts",
    "--container-workdir",
    "--no-container-mount-home",
    "--no-container-remap-root",
]


def _flags(options: Sequence[str]) -> list[str]:
    return [opt.split("=", 1)[0] for opt in options if opt != "--ignore-pbs"]


@pytest.mark.parametrize(
    ("runtime", "flags"),
    [("none", BASE_FLAGS), ("pyxis", BASE_FLAGS + CONTAINER_FLAGS), ("docker", BASE_FLAGS)],
)
def test_option_order_is_fixed(hello: Template, runtime: str, flags: list[str]) -> None:
    assert _flags(render(make_spec(hello, runtime)).options) == flags


def test_option_values(hello: Template) -> None:
    options = render(make_spec(hello, "pyxis")).options
    values = {opt.split("=", 1)[0]: opt.split("=", 1)[1] for opt in options if "=" in opt}
    assert values == {
        "--job-name": "hello world",
        "--account": "acme",
        "--partition": "gpu",
        "--nodes": "1",
        "--ntasks": "1",
        "--cpus-per-task": "4",
        "--mem": "16G",
        "--gres": "gpu:rtx4090:2",
        "--time": "30",
        "--chdir": JOB_DIR,
        "--output": f"{JOB_DIR}/stdout.log",
        "--error": f"{JOB_DIR}/stderr.log",
        "--comment": f"gpupool:{JOB_ID}",
        "--container-image": IMAGE,
        "--container-mounts": f"{JOB_DIR}:{JOB_DIR},{DATA_DIR}:/data,{OPERATOR_MOUNT}",
        "--container-workdir": JOB_DIR,
    }


def test_options_are_sbatch_options(hello: Template) -> None:
    spec = make_spec(hello, "pyxis")
    assert render(spec).options == sbatch_options(spec)


def test_output_paths(hello: Template) -> None:
    rendered = render(make_spec(hello))
    assert f"--output={JOB_DIR}/stdout.log" in rendered.options
    assert f"--error={JOB_DIR}/stderr.log" in rendered.options
    assert log_path(JOB_DIR, "stderr") == f"{JOB_DIR}/stderr.log"


HOSTILE_NAMES = ["hello world", "x\n#SBATCH --account=evil", "a'; echo foo", '"#SBATCH', "$(id)"]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_job_name_is_first_option_and_never_in_script(hello: Template, runtime: str, name: str) -> None:
    rendered = render(make_spec(hello, runtime, name=name))
    assert rendered.options[0] == f"--job-name={name}"
    assert sum(opt.startswith("--job-name") for opt in rendered.options) == 1
    assert "--job-name" not in rendered.script
    assert "#SBATCH -J" not in rendered.script
    if name != "hello world":
        assert name not in rendered.script


@pytest.mark.parametrize(
    ("gpus", "gpu_type", "expected"),
    [(1, None, "gpu:1"), (2, None, "gpu:2"), (2, "rtx4090", "gpu:rtx4090:2"), (4, "rtx4090", "gpu:rtx4090:4")],
)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_gres(hello: Template, runtime: str, gpus: int, gpu_type: str | None, expected: str) -> None:
    assert gres(gpus, gpu_type) == expected
    rendered = render(make_spec(hello, runtime, gpus=gpus, gpu_type=gpu_type))
    assert [opt for opt in rendered.options if opt.startswith("--gres")] == [f"--gres={expected}"]
    assert [line for line in rendered.script.split("\n") if "--gres" in line] == [f"#SBATCH --gres={expected}"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_no_sbatch_line_after_first_command(hello: Template, runtime: str) -> None:
    script = render(make_spec(hello, runtime)).script
    after = lines_after_first_command(script)
    assert after[0] == "set -euo pipefail"
    assert [line for line in after if line.lstrip().startswith("#SBATCH")] == []


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_directive_block_is_exactly_the_options(hello: Template, runtime: str) -> None:
    rendered = render(make_spec(hello, runtime))
    assert rendered.script.startswith("#!/bin/bash\n")
    assert sbatch_script_directives(rendered.script) == expected_script_directives(rendered)
    assert sbatch_wrapper_directives(rendered.script, rendered.options) == []


@pytest.mark.parametrize(
    "mount",
    ["/data/my files:/data:ro", "/data/#1:/d1:ro", '/data/q"uote:/q:ro', "/data/back\\slash:/b:ro", "/data/it's:/i"],
)
def test_directive_values_that_need_quoting_read_back_exactly(hello: Template, mount: str) -> None:
    rendered = render(make_spec(hello, "pyxis", container_mounts=(mount,)))
    assert sbatch_script_directives(rendered.script) == expected_script_directives(rendered)


@pytest.mark.parametrize("image", ["nvcr.io/x:1\n#SBATCH --account=evil", "img\rname", "a\x00b"])
def test_directive_value_with_line_break_or_nul_is_refused(hello: Template, image: str) -> None:
    with pytest.raises(ValueError, match="single line"):
        render(make_spec(hello, "pyxis", container_image=image))


def test_render_is_pure(hello: Template, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = make_spec(hello, "docker")
    first = render(spec)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SBATCH_ACCOUNT", "evil")
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    assert render(spec) == first
    assert render(dataclasses.replace(spec)) == first


def test_docker_body_is_a_quoted_heredoc(hello: Template) -> None:
    script = render(make_spec(hello, "docker")).script
    lines = script.split("\n")
    opener = next(line for line in lines if "<<'" in line)
    assert opener.endswith("' &")  # in the background, so the shell can wait and trap signals
    delimiter = opener.rsplit("<<'", 1)[1].removesuffix("' &")
    assert delimiter.startswith("GPUPOOL_BODY_")
    assert lines.count(delimiter) == 1
    body_lines = lines[lines.index(opener) + 1 : lines.index(delimiter)]
    assert body_lines == ["set -euo pipefail", *hello.body.rstrip("\n").split("\n")]
    # Parameter values reach the container by name only, never on the docker command line.
    assert "  --env GPUPOOL_PARAM_MESSAGE \\" in lines
    assert "hi there" not in "\n".join(lines[lines.index("# ---- template hello ----") :])


# --- hostile parameter values --------------------------------------------------------

SENTINEL = "@SENTINEL@"  # replaced by a unique path per test


def _one_megabyte() -> str:
    chunk = f"$(touch {SENTINEL})`touch {SENTINEL}`'\"\\\n#SBATCH --account=evil\n"
    text = chunk * (1_048_576 // len(chunk) + 1)
    return text[:1_048_576]


HOSTILE_VALUES = {
    "quote-echo": "a'; echo foo",
    "quote-touch": f"a'; touch {SENTINEL}; '",
    "newline-zero": "a\n0",
    "sbatch-line": "x\n#SBATCH --account=evil",
    "command-subst": f"$(touch {SENTINEL})",
    "backticks": f"`touch {SENTINEL}`",
    "double-quote": '"',
    "pipe": "a|b",
    "hash": "#",
    "backslash": "\\",
    "single-quote": "'",
    "unicode": "h\u00e9llo w\u00f6rld \u2713 \U0001f680 \u202eevil \u0301 \u65e5\u672c",
    "empty": "",
    "trailing-newlines": "end\n\n",
    "dash-n": "-n",
    "format": "%s%n%d%%",
    "expansions": "${IFS}$HOME*?[a]~ !! {a,b}",
    "controls": "\r\n\t\x1b[31m\x01\x7f",
    "pbs-line": "x\n#PBS -t 1-1000 #",
    "bsub-line": "x\n#BSUB -q evil #",
    "one-megabyte": _one_megabyte(),
}


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    return tmp_path / f"pwned-{uuid.uuid4().hex}"


def _hostile_spec(value: str, runtime: str = "none", job_dir: str = JOB_DIR) -> JobSpec:
    return JobSpec(
        job_id=JOB_ID,
        account="acme",
        name="hostile",
        template="hello",
        body=PRINT_MESSAGE_BODY,
        params={"message": value, "seconds": 0},
        gpus=1,
        gpu_type=None,
        cpus=1,
        mem_gb=4,
        time_limit_min=5,
        partition="gpu",
        job_dir=job_dir,
        runtime=runtime,
        container_image=None if runtime == "none" else IMAGE,
        container_mounts=() if runtime == "none" else (OPERATOR_MOUNT,),
    )


@pytest.mark.parametrize("value", HOSTILE_VALUES.values(), ids=HOSTILE_VALUES.keys())
def test_hostile_value_reaches_the_job_verbatim(value: str, sentinel: Path, tmp_path: Path) -> None:
    value = value.replace(SENTINEL, str(sentinel))
    # The job's folder is the test's: the script makes its output folder there.
    script = render(_hostile_spec(value, job_dir=str(tmp_path / "job"))).script
    assert script.endswith("\n" + PRINT_MESSAGE_BODY)
    path = tmp_path / "job.sbatch"
    path.write_bytes(script.encode("utf-8"))
    result = subprocess.run(
        [BASH, str(path)],
        capture_output=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "HOME": str(tmp_path)},
        timeout=30,
        check=False,
    )
    assert result.stderr == b""
    assert result.returncode == 0
    assert result.stdout == value.encode("utf-8")
    assert not sentinel.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job", "job.sbatch"]
    assert [p.name for p in (tmp_path / "job").iterdir()] == ["output"]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("value", HOSTILE_VALUES.values(), ids=HOSTILE_VALUES.keys())
def test_hostile_value_creates_no_sbatch_directive(value: str, runtime: str) -> None:
    rendered = render(_hostile_spec(value, runtime))
    assert sbatch_script_directives(rendered.script) == expected_script_directives(rendered)
    assert sbatch_wrapper_directives(rendered.script, rendered.options) == []


def test_param_types_reach_the_job_as_shell_words(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        _hostile_spec("", job_dir=str(tmp_path)),
        params={"flag": True, "off": False, "lr": 0.0003, "n": 5, "big": 1e20},
        body='printf "%s|" "$GPUPOOL_PARAM_FLAG" "$GPUPOOL_PARAM_OFF" "$GPUPOOL_PARAM_LR" '
        '"$GPUPOOL_PARAM_N" "$GPUPOOL_PARAM_BIG" "$GPUPOOL_JOB_ID" "$GPUPOOL_TEMPLATE"\n',
    )
    path = tmp_path / "job.sbatch"
    path.write_text(render(spec).script)
    result = subprocess.run([BASH, str(path)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, check=False)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"true|false|0.0003|5|1e+20|{JOB_ID}|hello|"


def test_exports_are_sorted_by_param_name() -> None:
    spec = dataclasses.replace(_hostile_spec(""), params={"zeta": 1, "alpha": 2, "mid": 3})
    exports = [line for line in render(spec).script.split("\n") if line.startswith("export ")]
    assert exports == [
        f"export GPUPOOL_JOB_ID={JOB_ID}",
        f"export GPUPOOL_JOB_DIR={JOB_DIR}",
        f"export GPUPOOL_OUTPUT_DIR={JOB_DIR}/output",
        "export GPUPOOL_TEMPLATE=hello",
        "export GPUPOOL_PARAM_ALPHA=2",
        "export GPUPOOL_PARAM_MID=3",
        "export GPUPOOL_PARAM_ZETA=1",
    ]


# --- validation in front of render ---------------------------------------------------


@pytest.mark.parametrize("value", ["a\x00b", "\x00", "ok" * 10 + "\x00"])
def test_hello_rejects_nul(hello: Template, value: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        hello.validate_params({"message": value})
    assert info.value.details["errors"] == [
        {"field": "params.message", "message": "Value error, must not contain NUL bytes"}
    ]


def test_hello_rejects_overlong_message(hello: Template) -> None:
    assert hello.validate_params({"message": "x" * 65536})["message"] == "x" * 65536
    with pytest.raises(ValidationFailed) as info:
        hello.validate_params({"message": "x" * 65537})
    assert info.value.details["errors"] == [
        {"field": "params.message", "message": "String should have at most 65536 characters"}
    ]


@pytest.mark.parametrize(
    "name", [key for key in HOSTILE_VALUES if key != "one-megabyte"]
)
def test_hello_accepts_hostile_but_valid_messages(hello: Template, name: str) -> None:
    value = HOSTILE_VALUES[name]
    assert hello.validate_params({"message": value}) == {"message": value, "seconds": 0}


# --- the renderings as bash sees them -----------------------------------------------
# docker is not installed on these machines; a stand-in on PATH records what the
# script asks of it, so the tests check the rendered file, not a mock of gpupool.

RUN_PARAMS = {
    "command": {"command": "a'; echo foo\n$(id)\n#SBATCH --account=evil"},
    "hello": {"message": "a'; echo foo\n$(id)", "seconds": 0},
    "inference": {"model": "meta-llama/Llama-3-8B", "input": "x\n#SBATCH --account=evil"},
    "train": {"data_dir": "/data/set1", "epochs": 2},
}


def spec_for(template: Template, runtime: str, job_dir: str) -> JobSpec:
    """The golden spec, for another template and a real folder."""
    return make_spec(
        template, runtime, template=template.name, params=template.validate_params(RUN_PARAMS[template.name]), job_dir=job_dir
    )


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", sorted(RUN_PARAMS))
def test_every_rendering_is_valid_bash(shipped_templates: dict[str, Template], tmp_path: Path, name: str, runtime: str) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render(spec_for(shipped_templates[name], runtime, str(tmp_path))).script)
    checked = subprocess.run(["/bin/bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr


# The batch environment of a job granted host GPUs 1 and 3: inside its device cgroup
# Slurm numbers them 0 and 1.
SLURM_BATCH_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_ON_NODE": "2"}


def recording_docker(tmp_path: Path, run_body: str = "cat > \"$record/stdin\"\n") -> tuple[Path, Path]:
    """A ``docker`` on PATH that writes each call's argv to <record>/<n>-<subcommand>; ``run`` also runs ``run_body``."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    record = tmp_path / "docker"
    record.mkdir()
    docker = fake_bin / "docker"
    docker.write_text(
        "#!/bin/bash\n"
        f"record={record}\n"
        'call="$record/$(ls "$record" | grep -c -- -)-$1"\n'
        'printf "%s\\n" "$@" > "$call"\n'
        'if [[ $1 == run ]]; then\n'
        'printf "%s" "$GPUPOOL_PARAM_MESSAGE" > "$record/message"\n'
        f"{run_body}"
        "fi\n"
    )
    docker.chmod(0o755)
    return fake_bin, record


def docker_calls(record: Path) -> list[list[str]]:
    calls = sorted((path for path in record.iterdir() if "-" in path.name), key=lambda path: int(path.name.split("-")[0]))
    return [path.read_text().splitlines() for path in calls]


def test_docker_runtime_runs_the_body_inside_the_container(hello: Template, tmp_path: Path) -> None:
    fake_bin, record = recording_docker(tmp_path)
    script = tmp_path / "job.sbatch"
    script.write_text(render(spec_for(hello, "docker", str(tmp_path))).script)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", **SLURM_BATCH_ENV}
    subprocess.run(["/bin/bash", str(script)], env=env, check=True, timeout=30)

    argv, remove = docker_calls(record)
    assert argv[argv.index("--gpus") + 1] == '"device=1,3"'  # the host's indices, not the job's 0,1
    assert argv[-3:] == ["nvcr.io#nvidia/pytorch:24.01-py3", "/bin/bash", "-s"]
    # Removed on the way out too, whether or not --rm already did.
    assert remove == ["rm", "--force", "gpupool-4242"]
    passed = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--env"}
    assert {"GPUPOOL_PARAM_MESSAGE", "GPUPOOL_PARAM_SECONDS", "SLURM_GPUS_ON_NODE", "GPUPOOL_OUTPUT_DIR"} <= passed
    # The output folder, made on the node before the container starts, where the container sees the job folder.
    assert (tmp_path / "output").is_dir() and f"{tmp_path}:{tmp_path}" in argv
    assert "CUDA_VISIBLE_DEVICES" not in passed  # renumbered from 0 inside the container
    assert (record / "stdin").read_text() == "set -euo pipefail\n" + hello.body
    assert (record / "message").read_text() == RUN_PARAMS["hello"]["message"]


def test_docker_runtime_refuses_to_run_without_allocated_gpus(hello: Template, tmp_path: Path) -> None:
    fake_bin, record = recording_docker(tmp_path)
    script = tmp_path / "job.sbatch"
    script.write_text(render(spec_for(hello, "docker", str(tmp_path))).script)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "CUDA_VISIBLE_DEVICES": "0"}
    result = subprocess.run(["/bin/bash", str(script)], env=env, capture_output=True, text=True, check=False, timeout=30)
    assert result.returncode != 0
    assert "no GPUs allocated: Slurm set no SLURM_JOB_GPUS" in result.stderr
    assert docker_calls(record) == []  # never on a job-relative index, never on every GPU


def test_docker_runtime_runs_only_under_slurm(hello: Template, tmp_path: Path) -> None:
    fake_bin, record = recording_docker(tmp_path)
    script = tmp_path / "job.sbatch"
    script.write_text(render(spec_for(hello, "docker", str(tmp_path))).script)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "SLURM_JOB_GPUS": "0"}
    result = subprocess.run(["/bin/bash", str(script)], env=env, capture_output=True, text=True, check=False, timeout=30)
    assert result.returncode != 0
    assert "SLURM_JOB_ID is unset" in result.stderr
    assert docker_calls(record) == []


def _docker_run_argv(script: str) -> list[str]:
    """The words of the rendered ``docker run`` command, as bash splits them before expansion."""
    lines = script.split("\n")
    start = next(index for index, line in enumerate(lines) if line.startswith("docker run "))
    end = next(index for index in range(start, len(lines)) if not lines[index].endswith("\\"))
    command = " ".join(line.removesuffix("\\").strip() for line in lines[start : end + 1])
    return shlex.split(command.split(" <<'", 1)[0])


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--rm", None),
        ("--init", None),
        ("--user", "$(id -u):$(id -g)"),  # the job runs as the tenant: its uid, never root
        ("--security-opt", "no-new-privileges"),
        ("--cap-drop", "ALL"),
        ("--gpus", '"device=$gpupool_gpus"'),
        ("--name", "$gpupool_container"),
        ("--label", "gpupool.slurm_job_id=$SLURM_JOB_ID"),  # what the node's Epilog removes by
        ("--cpus", "4"),
        ("--memory", "16g"),
    ],
)
def test_docker_run_is_confined(hello: Template, flag: str, value: str | None) -> None:
    argv = _docker_run_argv(render(make_spec(hello, "docker")).script)
    assert flag in argv
    if value is not None:
        assert value in [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


@pytest.mark.parametrize("flag", ["--privileged", "--cap-add", "--pid", "--network", "--device", "--security-opt=seccomp=unconfined"])
def test_docker_run_grants_nothing_extra(hello: Template, flag: str) -> None:
    argv = _docker_run_argv(render(make_spec(hello, "docker")).script)
    assert not [arg for arg in argv if arg == flag or arg.startswith(flag + "=")]
    assert "-v" not in argv and "/var/run/docker.sock" not in " ".join(argv)


def _default_signals() -> None:
    for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def test_docker_script_traps_exit_and_the_signals_slurm_sends(hello: Template, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render(spec_for(hello, "docker", str(tmp_path))).script)
    # bash -n for the syntax; then `trap -p` at the point docker would start shows what is installed.
    subprocess.run(["/bin/bash", "-n", str(script)], check=True, timeout=30)
    text = script.read_text()
    prelude = text[: text.index("docker run ")] + "trap -p\n"
    shown = subprocess.run(
        ["/bin/bash", "-c", prelude], env={"PATH": "/usr/bin:/bin", **SLURM_BATCH_ENV}, capture_output=True, text=True, check=True, timeout=30,
        # As slurmstepd starts a batch script: no signal ignored. (A test run started in the background by a
        # non-interactive shell ignores SIGINT and SIGQUIT, and bash cannot trap what it was started ignoring.)
        preexec_fn=_default_signals,
    ).stdout.splitlines()
    assert "trap -- 'gpupool_remove_container' EXIT" in shown
    assert "trap -- 'exit 143' SIGTERM" in shown
    assert "trap -- 'exit 130' SIGINT" in shown


def test_docker_container_is_removed_when_the_job_is_cancelled(hello: Template, tmp_path: Path) -> None:
    # `docker run` stands still until killed, like a long job; then the batch shell gets the
    # SIGTERM slurmstepd sends at scancel or at the time limit.
    fake_bin, record = recording_docker(tmp_path, run_body='touch "$record/started"\nexec sleep 600\n')
    script = tmp_path / "job.sbatch"
    script.write_text(render(spec_for(hello, "docker", str(tmp_path))).script)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", **SLURM_BATCH_ENV}
    job = subprocess.Popen(["/bin/bash", str(script)], env=env)
    try:
        wait_for_file(record / "started")
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=30) == 143
    finally:
        job.kill()
    run, remove = docker_calls(record)
    assert run[0] == "run"
    assert remove == ["rm", "--force", "gpupool-4242"]


def wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
