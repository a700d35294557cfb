"""run_command(): the one place gpupool starts a program. Only harmless programs here."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.errors import (
    CommandFailed,
    CommandNotFound,
    CommandTimedOut,
    SlurmUnavailable,
)
from gpupool.proc import RunAs, minimal_env, run_command

SH = "/bin/sh"
ENV = shutil.which("env") or "/usr/bin/env"
SLEEP = shutil.which("sleep") or "/bin/sleep"


def test_echo() -> None:
    result = run_command(["/bin/echo", "hello", "two words"], timeout_s=5)
    assert (result.argv, result.returncode, result.stdout, result.stderr) == (
        ("/bin/echo", "hello", "two words"),
        0,
        "hello two words\n",
        "",
    )
    assert result.duration_s >= 0


def test_input_text() -> None:
    assert run_command(["/bin/cat"], timeout_s=5, input_text="line 1\nline 2").stdout == "line 1\nline 2"


def test_failure_keeps_stderr() -> None:
    argv = [SH, "-c", "echo $X; echo 'boom on stderr' >&2; exit 3"]
    with pytest.raises(CommandFailed) as info:
        run_command(argv, timeout_s=5, env={"X": "from-env"})
    error = info.value
    assert isinstance(error, SlurmUnavailable)
    assert (error.returncode, error.stderr, error.argv) == (3, "boom on stderr\n", argv)
    assert error.message == "/bin/sh failed: boom on stderr"
    assert error.code == "slurm_command_failed"


def test_failure_without_stderr_names_the_status() -> None:
    with pytest.raises(CommandFailed) as info:
        run_command([SH, "-c", "exit 4"], timeout_s=5)
    assert info.value.message == "/bin/sh failed: exit status 4"


def test_check_false_returns_the_result() -> None:
    result = run_command([SH, "-c", "echo $X; exit 3"], timeout_s=5, env={"X": "val"}, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (3, "val\n", "")


def test_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimedOut) as info:
        run_command([SLEEP, "5"], timeout_s=0.2)
    assert time.monotonic() - started < 3
    error = info.value
    assert error.message == f"{SLEEP} did not answer within 0.2 s"
    assert error.code == "slurm_timeout"
    assert error.argv == [SLEEP, "5"]


def test_timeout_keeps_stderr_so_far() -> None:
    with pytest.raises(CommandTimedOut) as info:
        run_command([SH, "-c", "echo partial >&2; exec sleep 5"], timeout_s=0.3)
    assert info.value.stderr == "partial\n"


def test_not_found() -> None:
    with pytest.raises(CommandNotFound) as info:
        run_command(["/nonexistent/gpupool-no-such-binary", "--version"], timeout_s=5)
    error = info.value
    assert isinstance(error, CommandFailed)
    assert (error.returncode, error.code) == (127, "slurm_command_missing")
    assert error.stderr == "/nonexistent/gpupool-no-such-binary: command not found"


@pytest.mark.parametrize("argv", ["/bin/echo hello", "echo; touch /tmp/x"])
def test_string_argv_refused(argv: str) -> None:
    with pytest.raises(TypeError, match="argv must be a sequence"):
        run_command(argv, timeout_s=5)  # type: ignore[arg-type]


def test_arguments_are_not_shell_words(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    result = run_command(["/bin/echo", f"$(touch {target})", ";", "|"], timeout_s=5)
    assert result.stdout == f"$(touch {target}) ; |\n"
    assert not target.exists()


def _child_env(**kwargs: Any) -> dict[str, str]:
    output = run_command([ENV], timeout_s=5, **kwargs).stdout
    return dict(line.split("=", 1) for line in output.splitlines())


def test_child_environment_is_minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOO_SECRET", "hunter2")
    monkeypatch.setenv("GPUPOOL_JWT_SECRET", "x" * 40)
    monkeypatch.setenv("GPUPOOL_DATABASE_URL", "postgresql://u:pw@db/gpupool")
    monkeypatch.setenv("SBATCH_ACCOUNT", "evil")
    monkeypatch.setenv("SBATCH_PARTITION", "evil")
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SLURM_JOBID", "99")
    monkeypatch.setenv("SLURM_JOB_ACCOUNT", "evil")
    monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
    monkeypatch.setenv("PATH", "/tmp/evil-bin:/usr/bin:/bin")
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    monkeypatch.setenv("HOME", "/home/gpupool-test")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    env = _child_env()
    assert env == {
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/home/gpupool-test",
    }
    assert not [name for name in env if name.startswith(("SBATCH_", "SLURM_JOB"))]
    assert "hunter2" not in "".join(env.values())


def test_slurm_conf_is_passed_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm-alt/slurm.conf")
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    env = _child_env()
    assert env["SLURM_CONF"] == "/etc/slurm-alt/slurm.conf"
    assert "SLURM_JOB_ID" not in env


def test_minimal_env_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert minimal_env({"PATH": "/opt/job/bin", "X": "1"}) == {
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "PATH": "/opt/job/bin",
        "X": "1",
    }


def test_explicit_env_is_used_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FOO_SECRET", "hunter2")
    assert _child_env(env={"ONLY": "this"}) == {"ONLY": "this"}


NOBODY = RunAs(uid=65534, gid=65534, umask=0o027)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can run a command as another user")


@needs_root
def test_run_as_is_that_user_for_good_with_no_other_group() -> None:
    script = "grep -E '^(Uid|Gid|Groups):' /proc/self/status; umask"
    lines = run_command([SH, "-c", script], timeout_s=5, run_as=NOBODY).stdout.splitlines()
    # Real, effective, saved and filesystem ids: nothing left to switch back to root with.
    assert [line.split() for line in lines] == [
        ["Uid:", "65534", "65534", "65534", "65534"],
        ["Gid:", "65534", "65534", "65534", "65534"],
        ["Groups:"],
        ["0027"],
    ]


@needs_root
def test_run_as_a_missing_command_is_not_found() -> None:
    with pytest.raises(CommandNotFound) as info:
        run_command(["/nonexistent/gpupool-no-such-binary"], timeout_s=5, run_as=NOBODY)
    assert (info.value.returncode, info.value.stderr) == (127, "/nonexistent/gpupool-no-such-binary: command not found")


@needs_root
def test_run_as_keeps_the_commands_own_failure() -> None:
    with pytest.raises(CommandFailed) as info:
        run_command([SH, "-c", "echo 'setpriv: failed to execute nothing' >&2; exit 127"], timeout_s=5, run_as=NOBODY)
    assert not isinstance(info.value, CommandNotFound)
    assert (info.value.returncode, info.value.stderr) == (127, "setpriv: failed to execute nothing\n")
