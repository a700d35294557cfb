"""Render an sbatch script and its command line from a validated job request.

``render`` is a pure function of ``JobSpec``: no clock, no filesystem, no
environment. Customer values reach the script only as shell-quoted
assignments (``shlex.quote``) after the ``#SBATCH`` block, so they can neither
start a directive nor run as code. Options go in one fixed order; the same
options are given on the sbatch command line, which Slurm lets override the
script, so account, partition, GRES and time limit can never come from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Values gpupool writes into #SBATCH lines unquoted; anything else is double-quoted,
# since sbatch's directive parser honours "..." and backslash but not '...'.
_DIRECTIVE_SAFE = re.compile(r"^[A-Za-z0-9_.,:/=@+%-]*$")


@dataclass(frozen=True)
class ArraySpec:
    """An array job's shape: ``count`` tasks (indices 0 to count - 1), at most ``max_parallel`` at once.

    For a sweep, ``sweep_values[i]`` is task i's value of the template parameter
    ``sweep_param``, as text. The values never enter the script: the run-as
    helper writes each to its own file in the job's folder, which the task reads.
    """

    count: int
    max_parallel: int | None = None
    sweep_param: str | None = None
    sweep_values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.count < 1 or (self.max_parallel is not None and self.max_parallel < 1):
            raise ValueError(f"an array has at least one task and runs at least one at once: {self!r}")
        if (self.sweep_param is None) != (not self.sweep_values) or (
            self.sweep_values and len(self.sweep_values) != self.count
        ):
            raise ValueError("a sweep has a parameter and exactly one value per task")

    @property
    def option_value(self) -> str:
        """``--array``'s value: ``0-<count - 1>``, with ``%<max_parallel>`` when throttled."""
        throttle = f"%{self.max_parallel}" if self.max_parallel is not None else ""
        return f"0-{self.count - 1}{throttle}"


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    account: str
    name: str
    template: str
    body: str
    params: Mapping[str, Any]
    gpus: int
    gpu_type: str | None
    cpus: int
    mem_gb: int
    time_limit_min: int
    partition: str
    job_dir: str
    runtime: str = "none"
    container_image: str | None = None
    container_mounts: tuple[str, ...] = field(default_factory=tuple)
    # For a session template (gpupool.sessions): the operator's port range for its server, "low-high".
    session_ports: str | None = None
    array: ArraySpec | None = None
    # A spot job: the QOS any full-price job may preempt; requeued when it is (its own runs' price tier).
    preemptible: bool = False
    # Requeued onto a healthy node when the GPU check ends it (a spot job always is); else never requeued.
    requeue_on_failure: bool = False
    # The account's storage (gpupool.storage), as $GPUPOOL_DATA; in a container it is mounted at /data.
    data_dir: str | None = None


@dataclass(frozen=True)
class RenderedJob:
    script: str
    options: tuple[str, ...]
    # A sweep's values, task i's at index i: files the run-as helper writes (ARRAY_VALUES_DIR).
    array_values: tuple[str, ...] | None = None


TAG_PREFIX = "gpupool:"
# The Slurm QOS of preemptible jobs (deploy: slurm_common_spot_qos); billing prices its runs at the spot tier.
SPOT_QOS = "spot"
# Preemption signals a job's steps only; with PreemptParameters=send_user_signal Slurm sends this
# instead, to the batch script itself (B:), so the script hears SIGTERM before the requeue.
# It also comes 30 s before the time limit, when Slurm's own SIGTERM would come anyway.
SPOT_SIGNAL = "B:TERM@30"


def job_tag(job_id: str) -> str:
    """The marker put in a Slurm job's comment, so a job can be found without its Slurm id."""
    return TAG_PREFIX + job_id


def log_path(job_dir: str, stream: str, task: int | None = None) -> str:
    """Where a job's ``stdout`` or ``stderr`` goes (an array task's: its own file): chosen by the server, never by the customer."""
    if task is not None:
        return f"{job_dir}/{stream}-{task}.log"
    return f"{job_dir}/{stream}.log"


def log_pattern(job_dir: str, stream: str, array: bool) -> str:
    """sbatch's ``--output``/``--error`` value: an array's tasks each write their own (``%a``, the task index)."""
    return f"{job_dir}/{stream}-%a.log" if array else log_path(job_dir, stream)


# An array sweep's values, one file per task named by its index, written by the run-as helper.
ARRAY_VALUES_DIR = "array-values"


# A session job's files besides its logs, made by the run-as helper before sbatch:
# the port its server listens on (written by the job, read by the service without
# following links, as logs are), and the session's secret (the tenant's alone).
SESSION_PORT_FILE = "session.port"
SESSION_SECRET_FILE = "session.secret"
SESSION_SHIM_FILE = ".gpupool-session-shim.py"
# Read once at import, so render() stays a function of its JobSpec alone.
_SHIM_SOURCE = Path(__file__).with_name("session_shim.py").read_text()


def session_shim_source() -> str:
    return _SHIM_SOURCE


def _session_preamble() -> list[str]:
    """Write the shim into the job's folder and define ``gpupool_session``, which templates call.

    The shim is part of the script, not a file on the node: it runs in whatever
    environment or image the job has, as the tenant, from the tenant's own folder.
    """
    source = session_shim_source()
    delimiter = "GPUPOOL_SHIM_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    return [
        "# gpupool's session shim: the job's one door, refusing whoever lacks the session's secret.",
        f'GPUPOOL_SESSION_SHIM="$GPUPOOL_JOB_DIR/{SESSION_SHIM_FILE}"',
        f"cat > \"$GPUPOOL_SESSION_SHIM\" <<'{delimiter}'",
        source.rstrip("\n"),
        delimiter,
        "gpupool_session() {",
        '  python3 "$GPUPOOL_SESSION_SHIM" --ports "$GPUPOOL_SESSION_PORTS" \\',
        f'    --secret-file "$GPUPOOL_JOB_DIR/{SESSION_SECRET_FILE}" --port-file "$GPUPOOL_JOB_DIR/{SESSION_PORT_FILE}" "$@"',
        "}",
    ]


def param_env_name(param: str) -> str:
    return "GPUPOOL_PARAM_" + param.upper()


def _ansi_c_quote(text: str) -> str:
    out = []
    for char in text:
        if char in "\\'":
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 32 or ord(char) == 127:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "$'" + "".join(out) + "'"


def shell_quote(text: str) -> str:
    """Quote for bash so the value stays on one line: customer text never starts a line,
    where sbatch would still read a ``#PBS``/``#BSUB`` directive or a reader mistake it for code."""
    if text.isprintable():
        return shlex.quote(text)
    return _ansi_c_quote(text)


def param_text(value: Any) -> str:
    """A parameter's value as the text its environment variable holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _shell_value(value: Any) -> str:
    return shell_quote(param_text(value))


def _directive_value(value: str) -> str:
    if _DIRECTIVE_SAFE.match(value):
        return value
    if "\n" in value or "\r" in value or "\x00" in value:
        raise ValueError(f"directive value must be a single line: {value!r}")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def gres(gpus: int, gpu_type: str | None) -> str:
    return f"gpu:{gpu_type}:{gpus}" if gpu_type else f"gpu:{gpus}"


# Where a container sees the account's storage.
CONTAINER_DATA_DIR = "/data"
# The job's output folder, in its job folder: $GPUPOOL_OUTPUT_DIR, what GET /jobs/<id>/outputs serves.
OUTPUT_FOLDER = "output"


def output_dir(job_dir: str) -> str:
    """``$GPUPOOL_OUTPUT_DIR``: the same path on the node and in a container, which sees the job folder at its own path."""
    return f"{job_dir}/{OUTPUT_FOLDER}"


def container_mounts(job_dir: str, data_dir: str | None, extra: tuple[str, ...]) -> str:
    """pyxis's ``--container-mounts``: the job's folder at its own path, the account's storage at /data, the site's."""
    data = (f"{data_dir}:{CONTAINER_DATA_DIR}",) if data_dir else ()
    return ",".join((f"{job_dir}:{job_dir}", *data, *extra))


def _container_mounts(spec: JobSpec) -> str:
    return container_mounts(spec.job_dir, spec.data_dir, spec.container_mounts)


def _requeue_options(spec: JobSpec) -> tuple[str, ...]:
    """Whether Slurm may requeue the job: ``squeue --json``'s ``requeue``, which the GPU check reads.

    Spot: the QOS Slurm prices, preempts and requeues by. requeue_on_failure: requeued
    when its GPU fails. --open-mode=append: each run's logs follow the last's, as Slurm
    would truncate them at a requeue. Any other job says --no-requeue, as the site's
    JobRequeue would otherwise requeue it (Slurm's default is 1).
    """
    if spec.preemptible:
        return (f"--qos={SPOT_QOS}", "--requeue", f"--signal={SPOT_SIGNAL}", "--open-mode=append")
    if spec.requeue_on_failure:
        return ("--requeue", "--open-mode=append")
    return ("--no-requeue",)


def sbatch_options(spec: JobSpec) -> tuple[str, ...]:
    """Every sbatch option, in the one order gpupool ever emits them."""
    options = [
        f"--job-name={spec.name}",
        f"--account={spec.account}",
        f"--partition={spec.partition}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={spec.cpus}",
        f"--mem={spec.mem_gb}G",
        f"--gres={gres(spec.gpus, spec.gpu_type)}",
        f"--time={spec.time_limit_min}",
        *_requeue_options(spec),
    ]
    if spec.array is not None:
        options.append(f"--array={spec.array.option_value}")
    options += [
        f"--chdir={spec.job_dir}",
        f"--output={log_pattern(spec.job_dir, 'stdout', spec.array is not None)}",
        f"--error={log_pattern(spec.job_dir, 'stderr', spec.array is not None)}",
        f"--comment={job_tag(spec.job_id)}",
        # sbatch would otherwise honour #PBS/#BSUB lines anywhere in the first 100 lines.
        "--ignore-pbs",
    ]
    if spec.runtime == "pyxis" and spec.container_image:
        options += [
            f"--container-image={spec.container_image}",
            f"--container-mounts={_container_mounts(spec)}",
            f"--container-workdir={spec.job_dir}",
            # The tenant's home holds nothing the job needs, and its own uid inside the
            # container keeps files it writes to the job folder the tenant's, whatever
            # the site's pyxis defaults say.
            "--no-container-mount-home",
            "--no-container-remap-root",
        ]
    return tuple(options)


# Slurm's description of the allocation, which templates read (train uses the GPU count).
# CUDA_VISIBLE_DEVICES stays out: inside the container the granted GPUs are renumbered from 0.
_SLURM_VARS_FOR_CONTAINER = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_GPUS_ON_NODE", "SLURM_CPUS_PER_TASK", "SLURM_MEM_PER_NODE")
_SLURM_ARRAY_VARS = ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")


# docker labels every container with the Slurm job it belongs to, so the node's Epilog
# (deploy/ansible/roles/container_runtime) can remove whatever a killed job left behind.
DOCKER_JOB_LABEL = "gpupool.slurm_job_id"


def _docker_wrapped(spec: JobSpec, env_names: list[str]) -> list[str]:
    """The body run by ``docker run`` as the tenant, on the job's GPUs, removed with the job.

    dockerd starts the container outside the job's cgroup, so nothing Slurm does to the
    job reaches it by itself: the client runs in the background while the shell waits,
    and a trap removes the container when the shell exits, including on the SIGTERM
    Slurm sends at cancel or time limit (``wait`` returns at once for a trapped signal).
    """
    assert spec.container_image
    # A delimiter derived from the body cannot occur in it as a line of its own.
    delimiter = "GPUPOOL_BODY_" + hashlib.sha256(spec.body.encode()).hexdigest()[:16]
    lines = ['gpupool_container="gpupool-${SLURM_JOB_ID:?not started by Slurm: SLURM_JOB_ID is unset}"']
    if spec.gpus > 0:
        # Host indices, as docker counts: CUDA_VISIBLE_DEVICES counts from 0 within the
        # job's device cgroup, which dockerd does not run in. Checked here, where a
        # missing value stops the job before any container starts.
        lines.append('gpupool_gpus="${SLURM_JOB_GPUS:?no GPUs allocated: Slurm set no SLURM_JOB_GPUS}"')
    lines += [
        "# dockerd runs the container outside this job's cgroup: remove it however this script ends.",
        "gpupool_docker_pid=''",
        "gpupool_remove_container() {",
        '  docker rm --force "$gpupool_container" >/dev/null 2>&1 || true',
        '  if [[ -n $gpupool_docker_pid ]]; then kill "$gpupool_docker_pid" 2>/dev/null || true; fi',
        "}",
        "trap gpupool_remove_container EXIT",
        "trap 'exit 143' TERM",
        "trap 'exit 130' INT",
        "docker run --rm --init --interactive \\",
        '  --name "$gpupool_container" \\',
        f'  --label "{DOCKER_JOB_LABEL}=$SLURM_JOB_ID" \\',
        f"  --label {shlex.quote('gpupool.job=' + spec.job_id)} \\",
    ]
    if spec.gpus > 0:
        lines.append('  --gpus "\\"device=$gpupool_gpus\\"" \\')
    lines += [
        # The job runs as the tenant, so this is the tenant's uid, never root.
        '  --user "$(id -u):$(id -g)" \\',
        "  --security-opt no-new-privileges \\",
        "  --cap-drop ALL \\",
        # Outside the job's cgroup Slurm's limits do not hold: the same ones, given to docker.
        f"  --cpus {spec.cpus} \\",
        f"  --memory {spec.mem_gb}g \\",
    ]
    slurm_vars = (*_SLURM_VARS_FOR_CONTAINER, *(_SLURM_ARRAY_VARS if spec.array is not None else ()))
    # Each variable as the script has it, but the storage, which the container sees at /data.
    lines += [
        f"  --env {name}={CONTAINER_DATA_DIR} \\" if name == "GPUPOOL_DATA" else f"  --env {name} \\"
        for name in (*env_names, *slurm_vars)
    ]
    data = (f"{spec.data_dir}:{CONTAINER_DATA_DIR}",) if spec.data_dir else ()
    for mount in (f"{spec.job_dir}:{spec.job_dir}", *data, *spec.container_mounts):
        lines.append(f"  --volume {shlex.quote(mount)} \\")
    lines += [
        f"  --workdir {shlex.quote(spec.job_dir)} \\",
        f"  {shlex.quote(spec.container_image)} /bin/bash -s <<'{delimiter}' &",
        "set -euo pipefail",
        spec.body.rstrip("\n"),
        delimiter,
        "gpupool_docker_pid=$!",
        "gpupool_status=0",
        'wait "$gpupool_docker_pid" || gpupool_status=$?',
        "gpupool_docker_pid=''",
        'exit "$gpupool_status"',
    ]
    return lines


def render(spec: JobSpec) -> RenderedJob:
    """The sbatch script and command-line options for ``spec``."""
    options = sbatch_options(spec)
    # The job name is customer text; it travels only as an argv element.
    directives = [f"#SBATCH {opt.split('=', 1)[0]}={_directive_value(opt.split('=', 1)[1])}"
                  if "=" in opt else f"#SBATCH {opt}"
                  for opt in options if not opt.startswith("--job-name=")]
    env: list[tuple[str, str]] = [
        ("GPUPOOL_JOB_ID", shell_quote(spec.job_id)),
        ("GPUPOOL_JOB_DIR", shell_quote(spec.job_dir)),
        ("GPUPOOL_OUTPUT_DIR", shell_quote(output_dir(spec.job_dir))),
        ("GPUPOOL_TEMPLATE", shell_quote(spec.template)),
    ]
    if spec.data_dir:
        # The storage's own path on the node; /data where the script runs inside a pyxis container.
        in_container = spec.runtime == "pyxis" and spec.container_image
        env.append(("GPUPOOL_DATA", shell_quote(CONTAINER_DATA_DIR if in_container else spec.data_dir)))
    if spec.session_ports is not None:
        env.append(("GPUPOOL_SESSION_PORTS", shell_quote(spec.session_ports)))
    params = [(param_env_name(name), _shell_value(spec.params[name])) for name in sorted(spec.params)]
    sweep = spec.array.sweep_param if spec.array is not None else None
    if sweep is not None and sweep in spec.params:
        raise ValueError(f"param {sweep!r} is swept: it has no single value")
    body = spec.body
    if spec.session_ports is not None:
        body = "\n".join(_session_preamble()) + "\n" + body
        spec = dataclasses.replace(spec, body=body)
    lines = [
        "#!/bin/bash",
        f"# gpupool job {spec.job_id}, template {spec.template}. Generated by gpupool: the",
        "# options below are also passed on the sbatch command line, which takes precedence.",
        *directives,
        "set -euo pipefail",
        *(f"export {name}={value}" for name, value in env),
        # Made as the job's user before any command of the customer's runs, so it is theirs and always there;
        # before the parameters are in the environment, where a long value fails any exec with E2BIG.
        'mkdir -p "$GPUPOOL_OUTPUT_DIR"',
        *(f"export {name}={value}" for name, value in params),
        *(_sweep_reader(sweep) if sweep is not None else ()),
        "",
        f"# ---- template {spec.template} ----",
    ]
    env_names = [name for name, _ in env + params] + ([param_env_name(sweep)] if sweep is not None else [])
    if spec.runtime == "docker" and spec.container_image:
        lines += _docker_wrapped(spec, env_names)
    elif spec.preemptible:
        lines += _spot_wrapped(spec.body)
    else:
        lines.append(spec.body.rstrip("\n"))
    values = spec.array.sweep_values if spec.array is not None and sweep is not None else None
    return RenderedJob(script="\n".join(lines) + "\n", options=options, array_values=values)


def _spot_wrapped(body: str) -> list[str]:
    """A spot job's body, run so that a preemption requeues the job rather than ending it.

    At preemption Slurm sends the script SIGTERM (--signal=B:TERM, PreemptParameters)
    and requeues the job only if it is still running when the grace time ends: a
    script that exits first ends the job (FAILED or COMPLETED). So the body runs as a
    child, gets the SIGTERM passed on, and after it has stopped the script waits for
    Slurm's requeue, whose own SIGTERM ends the script. (The same SIGTERM comes 30 s
    before the time limit, where waiting ends at the limit, as the job would without it.)
    """
    return [
        "gpupool_signalled=''",
        # The second SIGTERM is Slurm's own, once it requeues (or ends) the job: stop then.
        "trap 'if [[ -n $gpupool_signalled ]]; then exit 143; fi; gpupool_signalled=1; kill -TERM \"${gpupool_body:-}\" 2>/dev/null || true' TERM",
        "(",
        body.rstrip("\n"),
        ") &",
        "gpupool_body=$!",
        "# wait returns early when the trap runs: wait again while the body still runs.",
        "while :; do",
        "  gpupool_status=0",
        '  wait "$gpupool_body" || gpupool_status=$?',
        '  kill -0 "$gpupool_body" 2>/dev/null || break',
        "done",
        'if [[ -n $gpupool_signalled ]]; then',
        "  echo 'gpupool: SIGTERM (preempted, or 30 s before the time limit); waiting for Slurm to requeue or end the job' >&2",
        "  while :; do sleep 1; done",
        "fi",
        'exit "$gpupool_status"',
    ]


def _sweep_reader(param: str) -> list[str]:
    """Read this task's sweep value, byte for byte, from the file the run-as helper wrote for it.

    ``read -d ''`` with an empty IFS and ``-r`` keeps every byte up to the end of
    the file: quotes, backslashes, leading blanks and trailing newlines, which
    ``$(cat ...)`` would strip. It returns 1 at the end of the file, hence the
    ``|| true``; the ``exec`` before it stops the script when the file is missing.
    """
    name = param_env_name(param)
    return [
        "# This task's sweep value: data in a file of the job's folder, never part of this script.",
        f'exec 3< "$GPUPOOL_JOB_DIR/{ARRAY_VALUES_DIR}/${{SLURM_ARRAY_TASK_ID:?not started as an array task}}"',
        f"IFS= read -r -d '' {name} <&3 || true",
        "exec 3<&-",
        f"export {name}",
    ]
