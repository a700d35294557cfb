"""Starting the run-as helper: its command line, and an environment of the settings it reads and nothing else.

``gpupool runas serve`` and ``python -m gpupool.slurm.runas`` take the same
arguments (``add_serve_arguments``). The CLI execs the second at once
(``exec_lean_helper``), so the helper holds neither the CLI's imports nor the
environment of whoever started it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from gpupool.config import ENV_PREFIX, Settings, load_settings
from gpupool.errors import ConfigError, GpupoolError
from gpupool.slurm.runas.server import serve

# The settings the helper reads (gpupool.slurm.tenants' too): its environment holds these and nothing else.
HELPER_SETTINGS = (
    "job_root", "service_user", "service_group", "tenant_user_prefix", "tenant_group", "tenant_uid_min",
    "tenant_uid_max", "slurm_bin_dir", "slurm_partition", "job_path", "slurm_submit_timeout_s",
    "slurm_query_timeout_s", "runas_timeout_s", "runas_max_connections", "container_runtime",
    "container_allowlist", "container_mounts", "max_array_tasks", "storage_root", "storage_agent_python",
    "storage_op_timeout_s",
)
_HELPER_BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC"}


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


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The helper's arguments, for ``gpupool runas serve`` and ``python -m gpupool.slurm.runas`` alike."""
    parser.add_argument("--socket", default=None, help="socket path (default: the runas_socket setting)")
    parser.add_argument("--allow-user", action="append", default=[], help="another Unix user allowed to connect")


def serve_socket(settings: Settings, args: argparse.Namespace) -> str:
    """The socket ``add_serve_arguments``' arguments name, else the runas_socket setting."""
    socket_path: str = args.socket or settings.runas_socket
    if not socket_path:
        raise ConfigError("give --socket or set runas_socket")
    return socket_path


def main(argv: Sequence[str] | None = None) -> int:
    """``gpupool runas serve`` once it has shed the CLI: settings from the environment, as the CLI reads them."""
    parser = argparse.ArgumentParser(prog="python -m gpupool.slurm.runas", description="The gpupool run-as helper (root).")
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
        socket_path = serve_socket(settings, args)
        clean = helper_environment(settings)
        if set(os.environ) - set(clean):
            # Started with more than it needs: start again with only that. The
            # second start finds nothing extra (its keys are clean's), so once only.
            _exec_helper(socket_path, args.allow_user, clean)
        serve(settings, socket_path, args.allow_user)
    except GpupoolError as exc:
        print(f"gpupool: error: {exc.message}", file=sys.stderr)
        return 1
    return 0
