"""What a tenant's request to the run-as helper may contain: every check on its names, options, script and values.

Pure: nothing here touches a file, a user or a process. The engine
(``gpupool.slurm.runas.engine``) runs each check before it acts, whoever the
caller; ``gpupool.slurm.runas.directives`` reads the script's ``#SBATCH`` lines
as sbatch does, for ``check_script``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from pathlib import Path

from gpupool.config import Settings
from gpupool.errors import TenantError
from gpupool.render import container_mounts, job_tag, log_pattern
from gpupool.slurm.runas.directives import script_directives
from gpupool.storage.paths import account_storage_dir

MAX_REQUEST_BYTES = 1024 * 1024
_JOB_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# gpupool.models.accounts.ACCOUNT_NAME, which is not imported: it brings SQLAlchemy into the helper.
_ACCOUNT = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# The options gpupool.render emits, and nothing else, whatever the caller. Valued ones
# only as --name=value: a bare --name would take the next argument as its value.
_FLAG_OPTIONS = frozenset(
    {"--ignore-pbs", "--no-container-mount-home", "--no-container-remap-root", "--requeue", "--no-requeue"}
)
_CONTAINER_OPTIONS = frozenset(
    {"--container-image", "--container-mounts", "--container-workdir", "--no-container-mount-home", "--no-container-remap-root"}
)
_ALWAYS_OPTIONS = frozenset(
    {
        "--job-name", "--account", "--partition", "--nodes", "--ntasks", "--cpus-per-task", "--mem", "--gres",
        "--time", "--chdir", "--output", "--error", "--comment", "--ignore-pbs",
    }
)
# A job Slurm may requeue (spot, or requeue_on_failure): both or neither.
# --open-mode=append: each run's logs follow the last's, as Slurm would truncate them at a requeue.
_REQUEUE_OPTIONS = frozenset({"--requeue", "--open-mode"})
# A spot job: all or none, and the one QOS a tenant may pick (gpupool.render.SPOT_QOS).
_SPOT_OPTIONS = _REQUEUE_OPTIONS | {"--qos", "--signal"}
_SUBMIT_OPTIONS = _ALWAYS_OPTIONS | _CONTAINER_OPTIONS | _SPOT_OPTIONS | {"--array", "--no-requeue"}
# gpupool's one array shape: every index from 0, optionally throttled (%K); no steps, lists or odd spellings.
_ARRAY_VALUE = re.compile(r"0-(0|[1-9][0-9]{0,4})(%[1-9][0-9]{0,4})?")
# What scancel takes for one task of an array: <array job id>_<index>.
_ARRAY_TASK_ID = re.compile(r"[1-9][0-9]{0,9}_(0|[1-9][0-9]{0,4})")
_VALUE_FORMATS = {
    "--cpus-per-task": re.compile(r"^[1-9][0-9]{0,5}$"),
    "--mem": re.compile(r"^[1-9][0-9]{0,6}G$"),
    "--gres": re.compile(r"^gpu(:[A-Za-z0-9_.-]{1,64})?:[0-9]{1,4}$"),
    "--time": re.compile(r"^[1-9][0-9]{0,6}$"),
}
_OPTIONAL_VALUE_FORMATS = {
    "--qos": re.compile(r"^spot$"),
    "--signal": re.compile(r"^B:TERM@30$"),
    "--open-mode": re.compile(r"^append$"),
}
# gpupool.sessions makes them with secrets.token_urlsafe: nothing else reaches the file.
_SESSION_SECRET = re.compile(r"^[A-Za-z0-9_-]{32,128}$")


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise TenantError(f"not a gpupool job id: {job_id!r}")
    return job_id


def check_account(account: str) -> str:
    if not isinstance(account, str) or not _ACCOUNT.match(account):
        raise TenantError(f"not a gpupool account name: {account!r}")
    return account


def job_folder(settings: Settings, account: str, job_id: str) -> Path:
    return Path(settings.job_root) / check_account(account) / check_job_id(job_id)


def _expected_values(settings: Settings, account: str, job_id: str, array: bool) -> dict[str, str]:
    """The one value gpupool.render gives each option that names something: compared as text, never resolved."""
    job_dir = str(job_folder(settings, account, job_id))
    return {
        "--account": account,
        "--partition": settings.slurm_partition,
        "--nodes": "1",
        "--ntasks": "1",
        "--chdir": job_dir,
        "--output": log_pattern(job_dir, "stdout", array),
        "--error": log_pattern(job_dir, "stderr", array),
        "--comment": job_tag(job_id),
        "--container-workdir": job_dir,
        "--container-mounts": container_mounts(
            job_dir, account_storage_dir(settings.storage_root, account) if settings.storage_root else None,
            settings.container_mounts,
        ),
    }


def _check_path_text(name: str, value: str) -> None:
    # The comparison below is on text, so this is only for a clear message: a
    # path with ".." (or "." or "//") can never equal the job's own folder.
    parts = value.split("/")
    if ".." in parts or "." in parts or "//" in value:
        raise TenantError(f"{name}={value!r}: a path with '..', '.' or '//' is not the job's own folder")


def check_submit_options(settings: Settings, options: Sequence[str], account: str, job_id: str) -> list[str]:
    """The sbatch options, if each is one the renderer emits, with the value it gives it for this job."""
    if not isinstance(options, list) or not all(isinstance(option, str) for option in options):
        raise TenantError("sbatch options must be a list of strings")
    array = any(option.startswith("--array=") for option in options)
    expected = _expected_values(settings, account, job_id, array)
    seen: dict[str, str] = {}
    for option in options:
        name, equals, value = option.partition("=")
        if name not in _SUBMIT_OPTIONS or "\x00" in option:
            raise TenantError(f"sbatch option {name!r} is not one gpupool submits")
        if (name in _FLAG_OPTIONS) == bool(equals):
            form = name if name in _FLAG_OPTIONS else f"{name}=<value>"
            raise TenantError(f"sbatch option {name!r} must be given as {form}")
        if name in seen:
            raise TenantError(f"sbatch option {name!r} given twice")
        seen[name] = value
    missing = sorted(_ALWAYS_OPTIONS - set(seen))
    if missing:
        raise TenantError(f"gpupool always submits {', '.join(missing)}; the request lacks it")
    if seen["--account"] != account:
        raise TenantError(f"a job of account {account!r} must be submitted with --account={account}")
    if seen["--comment"] != expected["--comment"]:
        raise TenantError("the job's comment must be its own gpupool tag")
    for name in ("--chdir", "--output", "--error", "--container-workdir", "--container-mounts"):
        if name in seen:
            for path in seen[name].split(",") if name == "--container-mounts" else [seen[name]]:
                for piece in path.split(":"):
                    _check_path_text(name, piece)
            if seen[name] != expected[name]:
                raise TenantError(f"{name} must be {expected[name]}, the job's own folder, not {seen[name]!r}")
    for name in ("--partition", "--nodes", "--ntasks"):
        if seen[name] != expected[name]:
            raise TenantError(f"{name} must be {expected[name]!r}, as gpupool submits it, not {seen[name]!r}")
    for name, pattern in _VALUE_FORMATS.items():
        if not pattern.match(seen[name]):
            raise TenantError(f"{name}={seen[name]!r} is not a value gpupool submits")
    for name, pattern in _OPTIONAL_VALUE_FORMATS.items():
        if name in seen and not pattern.match(seen[name]):
            raise TenantError(f"{name}={seen[name]!r} is not a value gpupool submits")
    spot = (_SPOT_OPTIONS - _REQUEUE_OPTIONS) & set(seen)
    if spot and not _SPOT_OPTIONS <= set(seen):
        raise TenantError(f"a spot job carries all of {', '.join(sorted(_SPOT_OPTIONS))}")
    requeue = _REQUEUE_OPTIONS & set(seen)
    if requeue and requeue != _REQUEUE_OPTIONS:
        raise TenantError(f"a job Slurm may requeue carries both of {', '.join(sorted(_REQUEUE_OPTIONS))}")
    if requeue and "--no-requeue" in seen:
        raise TenantError("sbatch options '--requeue' and '--no-requeue' contradict each other")
    if array:
        array_size(settings, seen["--array"])
    _check_container_options(settings, seen)
    return list(options)


def array_size(settings: Settings, value: str) -> int:
    """The number of tasks of ``--array=<value>``, if it is gpupool's shape and within max_array_tasks."""
    match = _ARRAY_VALUE.fullmatch(value)
    if match is None:
        raise TenantError(f"--array={value!r} is not a value gpupool submits (0-<last index>[%<at once>])")
    count = int(match.group(1)) + 1
    if count > settings.max_array_tasks:
        raise TenantError(f"--array={value!r} has {count} tasks; the operator allows at most {settings.max_array_tasks}")
    return count


def array_count(options: Sequence[str]) -> int | None:
    """The task count of the (checked) options' --array; None for a single job."""
    for option in options:
        name, _, value = option.partition("=")
        if name == "--array":
            match = _ARRAY_VALUE.fullmatch(value)
            assert match is not None  # check_submit_options came first
            return int(match.group(1)) + 1
    return None


def check_array_values(values: Sequence[str] | None, count: int | None) -> list[str] | None:
    """A sweep's values, if there is one text per task of the array and none holds a NUL."""
    if values is None:
        return None
    if count is None:
        raise TenantError("sweep values come with an array job (--array) only")
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise TenantError("sweep values must be a list of strings")
    if len(values) != count:
        raise TenantError(f"an array of {count} task(s) takes {count} sweep value(s), not {len(values)}")
    if any("\x00" in value for value in values):
        raise TenantError("a sweep value must not contain a NUL byte")
    try:
        for value in values:
            value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TenantError("a sweep value is not valid UTF-8 text") from exc
    return list(values)


def _check_container_options(settings: Settings, seen: dict[str, str]) -> None:
    given = _CONTAINER_OPTIONS & set(seen)
    if not given:
        return
    if settings.container_runtime != "pyxis":
        raise TenantError(f"container options need container_runtime pyxis, not {settings.container_runtime!r}")
    if given != _CONTAINER_OPTIONS:
        raise TenantError(f"a pyxis job carries all of {', '.join(sorted(_CONTAINER_OPTIONS))}")
    image = seen["--container-image"]
    if not any(fnmatch.fnmatchcase(image, pattern) for pattern in settings.container_allowlist):
        raise TenantError(f"container image {image!r} is not in the container allowlist")


def check_session_secret(session_secret: str | None) -> str | None:
    if session_secret is not None and not _SESSION_SECRET.fullmatch(session_secret):
        raise TenantError("a session secret is 32 to 128 URL-safe characters")
    return session_secret


def check_script(script: str, options: Sequence[str]) -> bytes:
    """The script's bytes, if each option its #SBATCH lines carry is one of the (checked) ``options``.

    The command line overrides the script, so a directive that repeats an option
    changes nothing; any other is refused, whatever it says.
    """
    if not isinstance(script, str):
        raise TenantError("the job script must be text")
    try:
        data = script.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TenantError("the job script is not valid UTF-8 text") from exc
    if len(data) > MAX_REQUEST_BYTES:
        raise TenantError("the job script must be at most 1 MiB")
    allowed = set(options)
    for directive in script_directives(data):
        if directive not in allowed:
            raise TenantError(
                f"the script's #SBATCH lines carry {directive!r}, which is not one of the options gpupool submits it with"
            )
    return data


def cancel_target(job: object) -> bool:
    if isinstance(job, str):
        return _ARRAY_TASK_ID.fullmatch(job) is not None
    return isinstance(job, int) and not isinstance(job, bool) and job > 0
