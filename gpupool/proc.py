"""The one place gpupool starts another program.

Commands are argument lists run with ``shell=False``, a timeout, and a minimal
environment built from scratch: nothing of the service's own environment (its
database URL, its JWT secret, any ``SBATCH_*`` or ``SLURM_*`` variable) can
leak into a Slurm command or, through sbatch's environment export, into a job.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpupool.errors import CommandFailed, CommandNotFound, CommandTimedOut

# Slurm prints times in the caller's zone; UTC makes every parsed time absolute.
_BASE_ENV = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC"}
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# util-linux's setpriv: sets the real, effective and saved uid and gid, drops supplementary groups, execs.
SETPRIV = "/usr/bin/setpriv"
# What setpriv exits with, and how its message starts, when it cannot execute the command.
_SETPRIV_EXEC_FAILED = {127: "command not found", 126: "not executable by this user"}


@dataclass(frozen=True)
class RunAs:
    """Another Unix identity to run a command as: its uid, its group, no supplementary groups.

    Only a root caller can switch; gpupool's run-as helper is that caller. The
    switch is setpriv's, which then execs the command: a child that changed its
    uid itself could not be started with vfork(), so Python would fork, and the
    caller would take a copy-on-write fault for every page it wrote afterwards
    (the helper spent more CPU on that than on the rest of a submit).
    """

    uid: int
    gid: int
    # Files the command creates are readable by the job folder's group (the service), never by others.
    umask: int = 0o027


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float


Runner = Callable[..., CommandResult]
"""``run_command`` or a stand-in with its signature: the seam SlurmClient takes its commands through."""


def minimal_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for child processes: locale, UTC, PATH, HOME and SLURM_CONF only."""
    env = dict(_BASE_ENV)
    env["PATH"] = _DEFAULT_PATH
    home = os.environ.get("HOME")
    if home:
        env["HOME"] = home
    # An operator may point Slurm at a non-default config; that is not a secret.
    slurm_conf = os.environ.get("SLURM_CONF")
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    if extra:
        env.update(extra)
    return env


def run_command(
    argv: Sequence[str],
    *,
    timeout_s: float,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    run_as: RunAs | None = None,
    cwd: str | None = None,
) -> CommandResult:
    """Run ``argv`` and return its output; raise with stderr kept on failure or timeout."""
    if isinstance(argv, str):  # a str would be split into characters, never a shell line
        raise TypeError("argv must be a sequence of arguments, not a string")
    args = tuple(argv)
    started = time.monotonic()
    command = args
    if run_as is not None:
        command = (SETPRIV, f"--reuid={run_as.uid}", f"--regid={run_as.gid}", "--clear-groups", "--", *args)
    try:
        completed = subprocess.run(  # noqa: S603 - list argv, shell=False
            command,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=dict(env) if env is not None else minimal_env(),
            shell=False,
            check=False,
            close_fds=True,
            cwd=cwd,
            umask=-1 if run_as is None else run_as.umask,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise CommandTimedOut(args, timeout_s, stderr) from exc
    except FileNotFoundError as exc:
        raise CommandNotFound(args, 127, f"{command[0]}: command not found") from exc
    except PermissionError as exc:
        raise CommandNotFound(args, 126, f"{command[0]}: not executable by this user") from exc
    if run_as is not None and completed.stderr.startswith(f"setpriv: failed to execute {args[0]}:"):
        problem = _SETPRIV_EXEC_FAILED.get(completed.returncode)
        if problem is not None:
            raise CommandNotFound(args, completed.returncode, f"{args[0]}: {problem}")
    result = CommandResult(
        argv=args,
        returncode=completed.returncode,
        stdout=completed.stdout,
        stderr=completed.stderr,
        duration_s=time.monotonic() - started,
    )
    if check and completed.returncode != 0:
        raise CommandFailed(args, completed.returncode, completed.stderr)
    return result


def spawn(
    argv: Sequence[str],
    *,
    run_as: RunAs,
    pass_fds: Sequence[int],
    env: Mapping[str, str],
    cwd: str = "/",
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as ``run_as`` (through setpriv) with ``pass_fds`` kept open; the caller talks to it and waits.

    For a child that answers over a socket it inherits rather than on its
    standard streams (gpupool.storage.broker); stdin and stdout are /dev/null,
    stderr a pipe the caller reads after the child exits.
    """
    if isinstance(argv, str):
        raise TypeError("argv must be a sequence of arguments, not a string")
    command = (SETPRIV, f"--reuid={run_as.uid}", f"--regid={run_as.gid}", "--clear-groups", "--", *argv)
    try:
        return subprocess.Popen(  # noqa: S603 - list argv, shell=False
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=dict(env),
            shell=False,
            close_fds=True,
            pass_fds=tuple(pass_fds),
            cwd=cwd,
            umask=run_as.umask,
        )
    except FileNotFoundError as exc:
        raise CommandNotFound(tuple(argv), 127, f"{SETPRIV}: command not found") from exc
