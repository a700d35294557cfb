"""Run ``sbatch`` and ``scancel`` as an account's tenant user, and nothing else.

The API runs as an unprivileged service user under ``NoNewPrivileges``, which
rules out sudo and every setuid helper. So a small root process,
``gpupool runas serve``, listens on a Unix socket that only the service group
can open, checks each caller's uid with ``SO_PEERCRED``, and acts as a tenant
only through the three operations below. Requests carry data, never command
lines: the helper builds every argv itself, checks each sbatch option against
the renderer's fixed list (and each option the script's own ``#SBATCH`` lines
carry, read as sbatch reads them), hands sbatch the very bytes it checked on
its standard input, creates the job folder without following links, and runs
the command as the tenant with a minimal environment. There is no shell
anywhere. The helper itself holds only the settings it uses: it starts
itself again with an environment of those alone, so no JWT secret or database
password is ever in it.

    submit   write the job's script and its empty logs (each array task's; a session's port file and secret; a sweep's values, one file per task) into its new folder, run sbatch as the tenant on the script's bytes
    test     the same checks, then ``sbatch --test-only`` as the tenant: no folder, no file, no job; Slurm's start estimate
    cancel   scancel the given jobs or array tasks (or all of the account's, as each of its users) as the tenant
    discard  remove a job folder whose sbatch Slurm refused
    budget   set the account's Slurm budget (GrpTRESMins=gres/gpu), the billing pass's one write
    member_limits  set a member user's GPUs at once and budget (GrpTRES, GrpTRESMins) on its own association
    files.*  open, list, move or delete in the account's storage, as the tenant (gpupool.storage.broker);
             an opened file's descriptor comes back with the answer (SCM_RIGHTS)

``submit``, ``test`` and ``cancel`` act as the account's own user, or, given
``user``, as that member user of the account: the helper checks for itself
that the user is one (``gpupool.slurm.tenants.lookup_member``: uid range,
tenants group, the account's group as its primary group), whatever the caller says.

``TenantActions`` does the work and is what the helper runs; an operator's
shell that is root uses it directly. ``RunasClient`` is the same interface
over the socket, for the API and the billing worker.

Wire format: one JSON object per line each way, one request per connection.
A connection that sends no whole request within ``runas_timeout_s`` is closed;
beyond ``runas_max_connections`` at once, a new one is answered ``busy``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import os
import pwd
import re
import shutil
import socket
import socketserver
import struct
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn, Protocol

from gpupool.config import ENV_PREFIX, Settings, load_settings
from gpupool.errors import (
    CommandFailed,
    CommandTimedOut,
    ConfigError,
    GpupoolError,
    RunasUnavailable,
    SubmissionUncertain,
    TenantError,
)
from gpupool.proc import CommandResult, minimal_env, run_command
from gpupool.render import (
    ARRAY_VALUES_DIR,
    SESSION_PORT_FILE,
    SESSION_SECRET_FILE,
    container_mounts,
    job_tag,
    log_path,
    log_pattern,
)
from gpupool.slurm.tenants import Tenant, account_users, ensure_tenant_folder, lookup_member, lookup_tenant, service_gid
from gpupool.storage.broker import handle_file_request, is_file_request
from gpupool.storage.paths import account_storage_dir

log = logging.getLogger("gpupool.slurm.runas")

SCRIPT_NAME = "job.sbatch"
# The job's umask, which sbatch hands slurmstepd as SLURM_UMASK: what a job writes
# is its tenant's alone unless its own code says otherwise (gpupool.slurm.tenants).
JOB_UMASK = "0077"
MAX_REQUEST_BYTES = 1024 * 1024
_JOB_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# gpupool.models.accounts.ACCOUNT_NAME, which is not imported: it brings SQLAlchemy into the helper.
_ACCOUNT = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# The options gpupool.render emits, and nothing else, whatever the caller. Valued ones
# only as --name=value: a bare --name would take the next argument as its value.
_FLAG_OPTIONS = frozenset({"--ignore-pbs", "--no-container-mount-home", "--no-container-remap-root", "--requeue"})
_CONTAINER_OPTIONS = frozenset(
    {"--container-image", "--container-mounts", "--container-workdir", "--no-container-mount-home", "--no-container-remap-root"}
)
_ALWAYS_OPTIONS = frozenset(
    {
        "--job-name", "--account", "--partition", "--nodes", "--ntasks", "--cpus-per-task", "--mem", "--gres",
        "--time", "--chdir", "--output", "--error", "--comment", "--ignore-pbs",
    }
)
# A spot job: both or neither, and the one QOS a tenant may pick (gpupool.render.SPOT_QOS).
# --open-mode=append: each run's logs follow the last's, as Slurm would truncate them at a requeue.
_SPOT_OPTIONS = frozenset({"--qos", "--requeue", "--signal", "--open-mode"})
_SUBMIT_OPTIONS = _ALWAYS_OPTIONS | _CONTAINER_OPTIONS | _SPOT_OPTIONS | {"--array"}
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
_SO_PEERCRED = struct.Struct("3i")
# gpupool.sessions makes them with secrets.token_urlsafe: nothing else reaches the file.
_SESSION_SECRET = re.compile(r"^[A-Za-z0-9_-]{32,128}$")
# How long a connection over runas_max_connections waits for a slot before it is refused.
BUSY_WAIT_S = 2.0

# The settings the helper reads (gpupool.slurm.tenants' too): its environment holds these and nothing else.
HELPER_SETTINGS = (
    "job_root", "service_user", "service_group", "tenant_user_prefix", "tenant_group", "tenant_uid_min",
    "tenant_uid_max", "slurm_bin_dir", "slurm_partition", "job_path", "slurm_submit_timeout_s",
    "slurm_query_timeout_s", "runas_timeout_s", "runas_max_connections", "container_runtime",
    "container_allowlist", "container_mounts", "max_array_tasks", "storage_root", "storage_agent_python",
    "storage_op_timeout_s",
)
_HELPER_BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC"}


class TenantActions(Protocol):
    def submit(
        self,
        account: str,
        job_id: str,
        script: str,
        options: Sequence[str],
        *,
        timeout_s: float,
        session_secret: str | None = None,
        array_values: Sequence[str] | None = None,
        user: str | None = None,
    ) -> CommandResult: ...

    def test_submit(
        self, account: str, job_id: str, script: str, options: Sequence[str], *, timeout_s: float, user: str | None = None
    ) -> CommandResult: ...

    def cancel(self, account: str, slurm_job_ids: Sequence[int | str] | None = None, user: str | None = None) -> CommandResult: ...

    def discard(self, account: str, job_id: str) -> None: ...

    def set_budget(self, account: str, gpu_minutes: int | None) -> CommandResult: ...

    def set_member_limits(self, account: str, user: str, gpu_limit: int | None, gpu_minutes: int | None) -> CommandResult: ...


# The TRES an account's Slurm budget counts: GPU-minutes of any type (billing.enforcement).
BUDGET_TRES = "gres/gpu"


def _check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise TenantError(f"not a gpupool job id: {job_id!r}")
    return job_id


def _check_account(account: str) -> str:
    if not isinstance(account, str) or not _ACCOUNT.match(account):
        raise TenantError(f"not a gpupool account name: {account!r}")
    return account


def job_folder(settings: Settings, account: str, job_id: str) -> Path:
    return Path(settings.job_root) / _check_account(account) / _check_job_id(job_id)


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
    spot = _SPOT_OPTIONS & set(seen)
    if spot and spot != _SPOT_OPTIONS:
        raise TenantError(f"a spot job carries all of {', '.join(sorted(_SPOT_OPTIONS))}")
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


def _array_count(options: Sequence[str]) -> int | None:
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


# -- what sbatch reads from the script ----------------------------------------------
#
# sbatch (src/sbatch/opt.c, 22.05) reads options from every line that starts, in
# its first column, with "#SBATCH" or "#SLURM" (a prefix: "#SBATCH--time=5" is
# one), skipping empty lines, lines of whitespace and lines whose first
# non-blank character is "#", and stops at the first other line. It splits a
# directive into words on C whitespace; '...' and "..." group, a backslash
# escapes the next byte unless that is whitespace (which ends the word all the
# same), an unquoted "#" ends the line, and a word "hetjob" or
# "packjob" starts another component of a heterogeneous job. #PBS and #BSUB
# lines are never read: --ignore-pbs is on every command line.

_DIRECTIVE_PREFIXES = (b"#SBATCH", b"#SLURM")
_C_SPACE = b" \t\n\v\f\r"
_HETJOB_WORDS = (b"hetjob", b"packjob")


def _directive_words(text: bytes, lineno: int) -> list[str]:
    """The words of one directive after its prefix, as sbatch's get_argument() splits them."""
    words: list[str] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in _C_SPACE:
            pos += 1
        if pos == end:
            return words
        rest = text[pos:]
        for word in _HETJOB_WORDS:
            if rest[: len(word)].lower() == word and (len(rest) == len(word) or rest[len(word)] in _C_SPACE):
                raise TenantError(f"script line {lineno}: {word.decode()!r} would start another job; gpupool submits one")
        if rest.startswith(b":"):
            raise TenantError(f"script line {lineno}: sbatch refuses a word starting with ':'")
        argument = bytearray()
        quote: int | None = None
        escaped = comment = False
        while pos < end and (quote is not None or text[pos] not in _C_SPACE):
            char = text[pos]
            pos += 1
            if escaped:
                escaped = False
            elif char == ord("\\"):
                escaped = True
                continue
            elif quote is not None:
                if char == quote:
                    quote = None
                    continue
            elif char in b"\"'":
                quote = char
                continue
            elif char == ord("#"):
                comment = True
                break
            argument.append(char)
        if quote is not None:
            raise TenantError(f"script line {lineno}: unmatched {chr(quote)} in an #SBATCH line")
        if argument:
            words.append(argument.decode("utf-8", errors="replace"))
        elif not comment:
            # sbatch stops reading the line at an empty word; gpupool never writes one.
            raise TenantError(f"script line {lineno}: an empty word in an #SBATCH line")
        if comment:
            return words


def script_directives(script: bytes) -> list[str]:
    """Every option sbatch reads from ``script`` itself, in order, split as sbatch splits them."""
    if b"\x00" in script:
        raise TenantError("the job script contains a NUL byte")
    options: list[str] = []
    for lineno, line in enumerate(script.split(b"\n"), start=1):
        prefix = next((p for p in _DIRECTIVE_PREFIXES if line.startswith(p)), None)
        if prefix is not None:
            options += _directive_words(line[len(prefix) :], lineno)
            continue
        content = line.lstrip(_C_SPACE)
        if content and not content.startswith(b"#"):
            break  # the first command: sbatch reads no directive after it
    return options


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


class DirectTenantActions:
    """Acts as tenants itself: needs root. The helper's engine, and the operator's when root."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def _tenant(self, account: str, user: str | None = None) -> Tenant:
        """The account's own user, or its member user ``user``, as this host's users say, never the caller."""
        if os.geteuid() != 0:
            raise ConfigError(
                "acting as a tenant needs root: set runas_socket to the gpupool runas helper's socket, "
                "or run this command as root"
            )
        if user is None:
            return lookup_tenant(self.settings, _check_account(account))
        if not isinstance(user, str):
            raise TenantError("a member user is a user name")
        return lookup_member(self.settings, _check_account(account), user)

    def _env(self, tenant: Tenant, job_dir: Path) -> dict[str, str]:
        # Exported to the job by sbatch: nothing of root's or the service's environment.
        return minimal_env(
            {"PATH": self.settings.job_path, "HOME": str(job_dir), "USER": tenant.user, "LOGNAME": tenant.user,
             "SLURM_UMASK": JOB_UMASK}
        )

    def submit(
        self,
        account: str,
        job_id: str,
        script: str,
        options: Sequence[str],
        *,
        timeout_s: float,
        session_secret: str | None = None,
        array_values: Sequence[str] | None = None,
        user: str | None = None,
    ) -> CommandResult:
        job_dir = job_folder(self.settings, account, job_id)
        tenant = self._tenant(account, user)
        argv_options = check_submit_options(self.settings, list(options), account, job_id)
        data = check_script(script, argv_options)
        if session_secret is not None and not _SESSION_SECRET.fullmatch(session_secret):
            raise TenantError("a session secret is 32 to 128 URL-safe characters")
        tasks = _array_count(argv_options)
        values = check_array_values(array_values, tasks)
        ensure_tenant_folder(self.settings, tenant, job_id)
        self._write_service_files(job_dir, data, tenant, session_secret, tasks)
        if values is not None:
            self._write_array_values(job_dir, values, tenant)
        # On standard input, not by path: the folder is the tenant's, and a tenant's
        # process could swap the file between this check and sbatch's read.
        argv = [self.settings.slurm_bin("sbatch"), "--parsable", *argv_options]
        return run_command(
            argv, timeout_s=timeout_s, input_text=script, env=self._env(tenant, job_dir), run_as=tenant.run_as(),
            cwd=str(job_dir),
        )

    def test_submit(
        self, account: str, job_id: str, script: str, options: Sequence[str], *, timeout_s: float, user: str | None = None
    ) -> CommandResult:
        """``sbatch --test-only`` as the tenant, on what ``submit`` would send: Slurm's estimate, and no job.

        The flag is added here, never taken from the caller (it is not in the
        option list), so ``submit`` cannot be made a test and this cannot submit.
        Nothing is written: the folder the options name need not exist, since
        sbatch only reads it at the job's start, which a test never has.
        """
        tenant = self._tenant(account, user)
        argv_options = check_submit_options(self.settings, list(options), account, job_id)
        check_script(script, argv_options)
        argv = [self.settings.slurm_bin("sbatch"), "--test-only", *argv_options]
        return run_command(
            argv, timeout_s=timeout_s, input_text=script, env=self._env(tenant, Path("/")), run_as=tenant.run_as(), cwd="/",
        )

    def _write_service_files(
        self, job_dir: Path, script: bytes, tenant: Tenant, session_secret: str | None, tasks: int | None = None
    ) -> None:
        """The job's script, the record of what was submitted, and its two logs, empty.

        The only files in the folder the service may read (group service, 0640):
        slurmstepd opens an existing output file as the tenant and truncates it,
        keeping its owner, group and mode, so the logs stay readable to the API
        while everything else the job writes does not. A session job also gets
        its port file (written by the job, read by the service like a log) and
        its secret, 0600: the tenant's alone (the service has it in its database).
        An array job's tasks each get their own two logs (``stdout-<index>.log``).
        """
        group = service_gid(self.settings)
        files = {SCRIPT_NAME: (script, 0o640)}
        for task in range(tasks) if tasks is not None else [None]:
            files |= {os.path.basename(log_path(str(job_dir), stream, task)): (b"", 0o640) for stream in ("stdout", "stderr")}
        if session_secret is not None:
            files[SESSION_PORT_FILE] = (b"", 0o640)
            files[SESSION_SECRET_FILE] = (session_secret.encode() + b"\n", 0o600)
        dir_fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for name, (data, mode) in files.items():
                # Made 0600 first, so the service group never reads a secret before its mode is set.
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
                with os.fdopen(fd, "wb") as handle:
                    os.fchown(handle.fileno(), tenant.uid, group)
                    os.fchmod(handle.fileno(), mode)  # whatever the helper's umask
                    handle.write(data)
        finally:
            os.close(dir_fd)

    def _write_array_values(self, job_dir: Path, values: Sequence[str], tenant: Tenant) -> None:
        """Each task's sweep value in ``array-values/<index>``: data the task reads, the tenant's alone."""
        dir_fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.mkdir(ARRAY_VALUES_DIR, 0o700, dir_fd=dir_fd)
            values_fd = os.open(ARRAY_VALUES_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        try:
            os.fchown(values_fd, tenant.uid, tenant.gid)
            for index, value in enumerate(values):
                fd = os.open(
                    str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=values_fd
                )
                with os.fdopen(fd, "wb") as handle:
                    os.fchown(handle.fileno(), tenant.uid, tenant.gid)
                    os.fchmod(handle.fileno(), 0o600)
                    handle.write(value.encode("utf-8"))
        finally:
            os.close(values_fd)

    def cancel(self, account: str, slurm_job_ids: Sequence[int | str] | None = None, user: str | None = None) -> CommandResult:
        """scancel the jobs as ``user`` (a member user of the account; None: the account's own user).

        Without ids, every job of the account, as each of its users that this
        host has (``account_users``): the account's own and every member's.
        """
        if slurm_job_ids is None:
            if user is not None:
                raise TenantError("cancelling every job of an account names no user: each of its users cancels its own")
            self._tenant(account)  # root, and a tenant account, before anything else
            results: list[CommandResult] = []
            failure: CommandFailed | None = None
            for tenant in account_users(self.settings, account):
                try:
                    results.append(self._scancel(tenant, [f"--account={account}", f"--user={tenant.user}"]))
                except CommandFailed as exc:  # the others' jobs are still cancelled
                    failure = failure or exc
            if failure is not None:
                raise failure
            return results[0]
        tenant = self._tenant(account, user)
        if not slurm_job_ids or not all(_cancel_target(job) for job in slurm_job_ids):
            raise TenantError("scancel needs positive Slurm job ids, or <array job id>_<task index>")
        return self._scancel(tenant, [str(job) for job in slurm_job_ids])

    def _scancel(self, tenant: Tenant, targets: list[str]) -> CommandResult:
        return run_command(
            [self.settings.slurm_bin("scancel"), *targets],
            timeout_s=self.settings.slurm_query_timeout_s,
            env=minimal_env({"HOME": "/", "USER": tenant.user}),
            run_as=tenant.run_as(),
            cwd="/",
        )

    def discard(self, account: str, job_id: str) -> None:
        self._tenant(account)
        _check_job_id(job_id)
        account_dir = Path(self.settings.job_root) / account
        account_fd = os.open(account_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            # rmtree with dir_fd never follows a link the tenant may have planted.
            shutil.rmtree(job_id, dir_fd=account_fd, ignore_errors=True)
        finally:
            os.close(account_fd)

    def set_budget(self, account: str, gpu_minutes: int | None) -> CommandResult:
        """GrpTRESMins=gres/gpu of a tenant account's association (None: no limit), as root.

        Only a tenant account (checked as for every other operation), only this
        one limit, only a whole number: the service gains no other Slurm right.
        """
        self._tenant(account)
        if gpu_minutes is not None and (not isinstance(gpu_minutes, int) or isinstance(gpu_minutes, bool) or gpu_minutes < 0):
            raise TenantError("a budget is a whole number of GPU-minutes, 0 or more, or none")
        value = "-1" if gpu_minutes is None else str(gpu_minutes)
        result = run_command(
            [self.settings.slurm_bin("sacctmgr"), "--immediate", "modify", "account", "where", f"name={account}",
             "set", f"GrpTRESMins={BUDGET_TRES}={value}"],
            timeout_s=self.settings.slurm_query_timeout_s,
            env=minimal_env({"HOME": "/"}),
            check=False,
            cwd="/",
        )
        # sacctmgr exits 1 with "Nothing modified" when the limit is already set.
        if result.returncode != 0 and "Nothing modified" not in result.stdout + result.stderr:
            raise CommandFailed(result.argv, result.returncode, result.stderr)
        return result

    def set_member_limits(self, account: str, user: str, gpu_limit: int | None, gpu_minutes: int | None) -> CommandResult:
        """GrpTRES and GrpTRESMins (gres/gpu) of a member user's own association under ``account``, as root.

        Only a user this host shows to be a member user of that account, only
        these two limits, only whole numbers (None: no limit): a member's GPUs
        at once and what is left of their monthly limit, which Slurm then holds
        their jobs to however they are submitted. The account's own limits
        stay on the account's association, above it.
        """
        tenant = self._tenant(account, user)
        if not tenant.is_member:
            raise TenantError("member limits are set on a member's user, not on the account's own")
        values = []
        for what, number in (("GPU limit", gpu_limit), ("budget", gpu_minutes)):
            if number is not None and (not isinstance(number, int) or isinstance(number, bool) or number < 0):
                raise TenantError(f"a member's {what} is a whole number, 0 or more, or none")
            values.append("-1" if number is None else str(number))
        result = run_command(
            [self.settings.slurm_bin("sacctmgr"), "--immediate", "modify", "user", "where", f"name={tenant.user}",
             f"account={account}", "set", f"GrpTRES={BUDGET_TRES}={values[0]}", f"GrpTRESMins={BUDGET_TRES}={values[1]}"],
            timeout_s=self.settings.slurm_query_timeout_s,
            env=minimal_env({"HOME": "/"}),
            check=False,
            cwd="/",
        )
        if result.returncode != 0 and "Nothing modified" not in result.stdout + result.stderr:
            raise CommandFailed(result.argv, result.returncode, result.stderr)
        return result


def _cancel_target(job: object) -> bool:
    if isinstance(job, str):
        return _ARRAY_TASK_ID.fullmatch(job) is not None
    return isinstance(job, int) and not isinstance(job, bool) and job > 0


# -- the socket -----------------------------------------------------------------------


def _result_payload(result: CommandResult) -> dict[str, Any]:
    return {"outcome": "ok", "returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr}


class _SilentClient(Exception):
    """The caller sent no whole request in time."""


class _Handler(socketserver.BaseRequestHandler):
    server: RunasServer
    request: socket.socket

    def handle(self) -> None:
        fds: list[int] = []
        try:
            self._handle(fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _handle(self, fds: list[int]) -> None:
        pid, uid, _gid = _SO_PEERCRED.unpack(
            self.request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _SO_PEERCRED.size)
        )
        if uid not in self.server.allowed_uids:
            log.warning("refused a request from uid %s (pid %s): not the service", uid, pid)
            self._reply({"outcome": "refused", "message": f"uid {uid} may not use the gpupool run-as helper"})
            return
        try:
            line = self._read_request()
            request = json.loads(line)
            if not isinstance(request, dict):
                raise TenantError("a request is a JSON object")
            if is_file_request(request):
                reply, opened = handle_file_request(self.server.actions.settings, request)
                fds += opened
            else:
                reply = self._dispatch(request)
        except _SilentClient:
            timeout_s = self.server.request_timeout_s
            log.warning("closed a connection from uid %s (pid %s): no whole request within %g s", uid, pid, timeout_s)
            reply = {"outcome": "refused", "message": f"no whole request within {timeout_s:g} s; closing the connection"}
        except (CommandTimedOut, CommandFailed) as exc:
            timed_out = isinstance(exc, CommandTimedOut)
            reply = {
                "outcome": "timed_out" if timed_out else "failed",
                "returncode": getattr(exc, "returncode", None),
                "stderr": exc.stderr,
                "timeout_s": exc.details.get("timeout_s"),
            }
        except (TenantError, ConfigError, ValueError, KeyError, TypeError, OSError) as exc:
            message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            log.warning("refused a request from uid %s: %s", uid, message)
            reply = {"outcome": "refused", "message": message}
        self._reply(reply, fds)

    def _read_request(self) -> bytes:
        """One line, within request_timeout_s in all: a caller that trickles bytes is closed too."""
        deadline = time.monotonic() + self.server.request_timeout_s
        received = bytearray()
        while b"\n" not in received:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _SilentClient()
            self.request.settimeout(remaining)
            try:
                chunk = self.request.recv(65536)
            except TimeoutError as exc:
                raise _SilentClient() from exc
            if not chunk:
                break
            received += chunk
            if len(received) > MAX_REQUEST_BYTES + 1:
                raise TenantError("request too large")
        line = bytes(received).split(b"\n", 1)[0]
        if len(line) > MAX_REQUEST_BYTES:
            raise TenantError("request too large")
        return line

    def _dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        actions = self.server.actions
        op, account = request.get("op"), request.get("account")
        if op == "ping":
            return {"outcome": "ok"}
        if not isinstance(account, str):
            raise TenantError("the request names no account")
        user = request.get("user")
        if user is not None and not isinstance(user, str):
            raise TenantError("user must be a string")
        if op == "submit":
            timeout_s = min(float(request["timeout_s"]), self.server.max_timeout_s)
            secret = request.get("session_secret")
            if secret is not None and not isinstance(secret, str):
                raise TenantError("session_secret must be a string")
            result = actions.submit(
                account, request["job_id"], request["script"], request["options"], timeout_s=timeout_s, session_secret=secret,
                array_values=request.get("array_values"), user=user,
            )
            log.info("sbatch as %s (%s) for job %s: %s", account, user or "account", request["job_id"], result.stdout.strip())
            return _result_payload(result)
        if op == "test":
            timeout_s = min(float(request["timeout_s"]), self.server.max_timeout_s)
            result = actions.test_submit(
                account, request["job_id"], request["script"], request["options"], timeout_s=timeout_s, user=user
            )
            return _result_payload(result)
        if op == "cancel":
            ids = request.get("slurm_job_ids")
            result = actions.cancel(account, None if ids is None else list(ids), user=user)
            log.info("scancel as %s (%s): %s", account, user or "account", "every job" if ids is None else ids)
            return _result_payload(result)
        if op == "discard":
            actions.discard(account, request["job_id"])
            return {"outcome": "ok"}
        if op == "budget":
            result = actions.set_budget(account, request.get("gpu_minutes"))
            log.info("budget of %s: %s GPU-minutes", account, request.get("gpu_minutes"))
            return _result_payload(result)
        if op == "member_limits":
            if user is None:
                raise TenantError("member_limits names the member's user")
            result = actions.set_member_limits(account, user, request.get("gpu_limit"), request.get("gpu_minutes"))
            log.info("limits of %s in %s: %s GPUs, %s GPU-minutes", user, account, request.get("gpu_limit"), request.get("gpu_minutes"))
            return _result_payload(result)
        raise TenantError(f"unknown operation {op!r}")

    def _reply(self, reply: dict[str, Any], fds: Sequence[int] = ()) -> None:
        self.request.settimeout(self.server.request_timeout_s)
        data = json.dumps(reply).encode() + b"\n"
        try:
            if fds and reply.get("outcome") is None:
                # The descriptor rides on the answer's first bytes (SCM_RIGHTS); the caller closes its copy.
                data = data[socket.send_fds(self.request, [data], list(fds)):]
            self.request.sendall(data)
        except OSError as exc:
            log.warning("could not answer %s: %s", reply.get("outcome"), exc)


class RunasServer(socketserver.UnixStreamServer):
    # Connections past runas_max_connections wait in the listen queue for a slot
    # (BUSY_WAIT_S). socketserver's backlog of 5 would refuse the sixth waiting
    # caller at connect() instead (EAGAIN: the API's 503 runas_unavailable).
    request_queue_size = 128

    def __init__(self, socket_path: str, actions: DirectTenantActions, allowed_uids: Iterable[int], group_gid: int) -> None:
        self.actions = actions
        self.allowed_uids = frozenset(allowed_uids)
        settings = actions.settings
        self.max_timeout_s = max(settings.slurm_submit_timeout_s, settings.slurm_query_timeout_s) * 2
        self.request_timeout_s = settings.runas_timeout_s
        self.max_connections = settings.runas_max_connections
        self._slots = threading.BoundedSemaphore(self.max_connections)
        # One thread per slot, each serving request after request: starting a thread
        # for every connection cost the helper more CPU than reading and checking its request.
        self._threads = ThreadPoolExecutor(max_workers=self.max_connections, thread_name_prefix="runas")
        path = Path(socket_path)
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        os.chown(path.parent, 0, group_gid)
        os.chmod(path.parent, 0o750)
        path.unlink(missing_ok=True)
        old_umask = os.umask(0o177)
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old_umask)
        os.chown(path, 0, group_gid)
        os.chmod(path, 0o660)

    def process_request(self, request: Any, client_address: Any) -> None:
        # In the accepting thread: while every slot is taken, new connections wait
        # in the listen queue instead of each costing a thread.
        if not self._slots.acquire(timeout=BUSY_WAIT_S):
            self._refuse_busy(request)
            return
        try:
            self._threads.submit(self._serve, request, client_address)
        except BaseException:
            self._slots.release()
            self.shutdown_request(request)
            raise

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # as socketserver does: log it, serve the next
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _refuse_busy(self, request: socket.socket) -> None:
        message = f"the run-as helper is busy: {self.max_connections} requests in progress; try again"
        log.warning("refused a connection: %s", message)
        try:
            request.settimeout(1.0)
            request.sendall(json.dumps({"outcome": "busy", "message": message}).encode() + b"\n")
        except OSError:
            pass
        finally:
            self.shutdown_request(request)


def serve(settings: Settings, socket_path: str, extra_users: Sequence[str] = (), ready: threading.Event | None = None) -> None:
    """Run the helper until killed: root only, callers limited to the service user (and root)."""
    if os.geteuid() != 0:
        raise ConfigError("gpupool runas serve must run as root")
    allowed = {0, pwd.getpwnam(settings.service_user).pw_uid}
    allowed |= {pwd.getpwnam(user).pw_uid for user in extra_users}
    server = RunasServer(socket_path, DirectTenantActions(settings), allowed, service_gid(settings))
    log.info("gpupool run-as helper on %s for uids %s", socket_path, sorted(allowed))
    if ready is not None:
        ready.set()
    with server:
        server.serve_forever()


def _setting_text(name: str, value: object) -> str:
    if isinstance(value, tuple):
        if any("," in item for item in value):
            raise ConfigError(f"setting {name}: the run-as helper cannot pass an item with a comma: {value!r}")
        return ",".join(value)
    return str(value)


def helper_environment(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The helper's whole environment: a locale, a PATH, SLURM_CONF, and the settings it reads, as GPUPOOL_*.

    Nothing else of whoever started it (the API's JWT secret or database URL in a
    shared environment file, GPUPOOL_CONFIG's file) reaches the helper or, through
    it, a tenant's sbatch.
    """
    source = os.environ if environ is None else environ
    env = dict(_HELPER_BASE_ENV)
    if source.get("SLURM_CONF"):
        env["SLURM_CONF"] = source["SLURM_CONF"]
    for name in HELPER_SETTINGS:
        env[ENV_PREFIX + name.upper()] = _setting_text(name, getattr(settings, name))
    return env


def _exec_helper(socket_path: str, extra_users: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    argv = [sys.executable, "-m", "gpupool.slurm.runas", "--socket", socket_path]
    for user in extra_users:
        argv += ["--allow-user", user]
    os.execve(sys.executable, argv, dict(env))


def exec_lean_helper(socket_path: str, extra_users: Sequence[str] = ()) -> NoReturn:
    """Become ``python -m gpupool.slurm.runas``: the helper without the imports or the environment of whoever started it.

    The helper forks once per sbatch, and a fork that switches user cannot use
    vfork, so each one copies the helper's page tables: in a process holding the
    CLI's imports (SQLAlchemy, Flask, ~70 MB) a fork and exec costs about twice
    the CPU it does in one holding only this module's (~19 MB). The exec is also
    what empties the environment: /proc/<pid>/environ shows the one a process was
    started with, whatever it later removes from os.environ.
    """
    _exec_helper(socket_path, extra_users, helper_environment(load_settings()))


def main(argv: Sequence[str] | None = None) -> int:
    """``gpupool runas serve`` once it has shed the CLI: settings from the environment, as the CLI reads them."""
    parser = argparse.ArgumentParser(prog="python -m gpupool.slurm.runas", description="The gpupool run-as helper (root).")
    parser.add_argument("--socket", required=True, help="socket path")
    parser.add_argument("--allow-user", action="append", default=[], help="another Unix user allowed to connect")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
        clean = helper_environment(settings)
        if set(os.environ) - set(clean):
            # Started with more than it needs: start again with only that. The
            # second start finds nothing extra (its keys are clean's), so once only.
            _exec_helper(args.socket, args.allow_user, clean)
        serve(settings, args.socket, args.allow_user)
    except GpupoolError as exc:
        print(f"gpupool: error: {exc.message}", file=sys.stderr)
        return 1
    return 0


class RunasClient:
    """``TenantActions`` over the helper's socket: what the unprivileged service uses."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.socket_path = settings.runas_socket

    def _call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        sent = False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                # The helper enforces the command's own timeout; this one only guards the helper.
                conn.settimeout(timeout_s + self.settings.runas_timeout_s)
                conn.connect(self.socket_path)
                conn.sendall(json.dumps(request).encode() + b"\n")
                sent = True
                reply = b""
                while not reply.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
        except TimeoutError as exc:
            raise CommandTimedOut([request.get("op", "runas")], timeout_s, "the run-as helper did not answer") from exc
        except OSError as exc:
            if sent:
                raise self._lost_answer(request) from exc
            raise RunasUnavailable(
                f"the gpupool run-as helper is not answering on {self.socket_path}: {exc.strerror or exc}"
            ) from exc
        try:
            answer: dict[str, Any] = json.loads(reply)
        except ValueError as exc:
            raise self._lost_answer(request) from exc
        if answer.get("outcome") == "refused":
            raise TenantError(f"the run-as helper refused: {answer.get('message')}")
        if answer.get("outcome") == "busy":
            # Refused before it read the request: nothing ran.
            raise RunasUnavailable(str(answer.get("message")))
        return answer

    @staticmethod
    def _lost_answer(request: dict[str, Any]) -> SubmissionUncertain:
        """The helper had the request and may have run it: the caller must look before acting again."""
        return SubmissionUncertain(
            f"the gpupool run-as helper took the {request.get('op')} request but gave no answer; it may have run"
        )

    @staticmethod
    def _result(argv: list[str], answer: dict[str, Any]) -> CommandResult:
        outcome = answer["outcome"]
        if outcome == "timed_out":
            raise CommandTimedOut(argv, float(answer.get("timeout_s") or 0), answer.get("stderr") or "")
        if outcome == "failed":
            raise CommandFailed(argv, int(answer.get("returncode") or 1), answer.get("stderr") or "")
        return CommandResult(tuple(argv), int(answer["returncode"]), answer["stdout"], answer["stderr"], 0.0)

    def submit(
        self,
        account: str,
        job_id: str,
        script: str,
        options: Sequence[str],
        *,
        timeout_s: float,
        session_secret: str | None = None,
        array_values: Sequence[str] | None = None,
        user: str | None = None,
    ) -> CommandResult:
        request: dict[str, Any] = {
            "op": "submit", "account": account, "job_id": job_id, "script": script, "options": list(options), "timeout_s": timeout_s,
        }
        if session_secret is not None:
            request["session_secret"] = session_secret
        if array_values is not None:
            request["array_values"] = list(array_values)
        if user is not None:
            request["user"] = user
        return self._result(["sbatch", *options], self._call(request, timeout_s))

    def test_submit(
        self, account: str, job_id: str, script: str, options: Sequence[str], *, timeout_s: float, user: str | None = None
    ) -> CommandResult:
        request: dict[str, Any] = {
            "op": "test", "account": account, "job_id": job_id, "script": script, "options": list(options), "timeout_s": timeout_s,
        }
        if user is not None:
            request["user"] = user
        return self._result(["sbatch", "--test-only", *options], self._call(request, timeout_s))

    def cancel(self, account: str, slurm_job_ids: Sequence[int | str] | None = None, user: str | None = None) -> CommandResult:
        request: dict[str, Any] = {
            "op": "cancel", "account": account, "slurm_job_ids": None if slurm_job_ids is None else list(slurm_job_ids),
        }
        if user is not None:
            request["user"] = user
        return self._result(["scancel"], self._call(request, self.settings.slurm_query_timeout_s))

    def discard(self, account: str, job_id: str) -> None:
        self._call({"op": "discard", "account": account, "job_id": job_id}, self.settings.slurm_query_timeout_s)

    def set_budget(self, account: str, gpu_minutes: int | None) -> CommandResult:
        request = {"op": "budget", "account": account, "gpu_minutes": gpu_minutes}
        return self._result(["sacctmgr"], self._call(request, self.settings.slurm_query_timeout_s))

    def set_member_limits(self, account: str, user: str, gpu_limit: int | None, gpu_minutes: int | None) -> CommandResult:
        request = {"op": "member_limits", "account": account, "user": user, "gpu_limit": gpu_limit, "gpu_minutes": gpu_minutes}
        return self._result(["sacctmgr"], self._call(request, self.settings.slurm_query_timeout_s))

    def ping(self) -> None:
        self._call({"op": "ping"}, self.settings.runas_timeout_s)


def tenant_actions(settings: Settings) -> TenantActions:
    """The helper's socket when configured, else direct action (which refuses unless root)."""
    if settings.runas_socket:
        return RunasClient(settings)
    return DirectTenantActions(settings)


if __name__ == "__main__":
    sys.exit(main())
