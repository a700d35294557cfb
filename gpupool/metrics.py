"""Prometheus metrics recorded by the core: Slurm commands and job-state refresh passes.

The API's own metrics (requests, submits) and the ``/metrics`` endpoint live
in ``api.metrics``; this module has no web dependency, so the Slurm client and
the refresher record the same way under gunicorn, the CLI or the billing worker.

Under gunicorn each worker is a process: with ``PROMETHEUS_MULTIPROC_DIR`` set
in the environment *before* the service starts, prometheus-client writes every
value to files in that folder and ``/metrics`` adds them up across workers
(see ``api.metrics``). That choice is the library's and is made when it is
first imported, which is why it is an environment variable and not a setting.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client.registry import REGISTRY

from gpupool.errors import CommandFailed, CommandNotFound, CommandTimedOut
from gpupool.proc import CommandResult, Runner

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Slurm commands take milliseconds when slurmctld is healthy and seconds when it is not.
_COMMAND_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

SLURM_COMMAND_SECONDS = Histogram(
    "gpupool_slurm_command_duration_seconds",
    "Time a Slurm command took, failed ones included.",
    ["command"],
    buckets=_COMMAND_BUCKETS,
)
SLURM_COMMAND_FAILURES = Counter(
    "gpupool_slurm_command_failures_total",
    "Slurm commands that exited non-zero (exit_status), ran past their timeout (timeout) "
    "or could not be started (not_found).",
    ["command", "reason"],
)
REFRESH_PASSES = Counter(
    "gpupool_job_state_refresh_passes_total",
    "Job-state refresh passes this process ran (it held the lease), by outcome.",
    ["outcome"],
)
REFRESH_SECONDS = Histogram(
    "gpupool_job_state_refresh_duration_seconds",
    "Time one job-state refresh pass took.",
    buckets=_COMMAND_BUCKETS,
)



def observe_slurm_commands(runner: Runner) -> Runner:
    """``runner`` that also records each command's duration and failure, named by its program."""

    def run(argv: Sequence[str], **kwargs: Any) -> CommandResult:
        command = Path(argv[0]).name if argv else "?"
        started = time.perf_counter()
        try:
            result = runner(argv, **kwargs)
        except CommandTimedOut:
            SLURM_COMMAND_FAILURES.labels(command=command, reason="timeout").inc()
            raise
        except CommandNotFound:
            SLURM_COMMAND_FAILURES.labels(command=command, reason="not_found").inc()
            raise
        except CommandFailed:
            SLURM_COMMAND_FAILURES.labels(command=command, reason="exit_status").inc()
            raise
        finally:
            SLURM_COMMAND_SECONDS.labels(command=command).observe(time.perf_counter() - started)
        if result.returncode != 0:  # asked not to raise (check=False); it still failed
            SLURM_COMMAND_FAILURES.labels(command=command, reason="exit_status").inc()
        return result

    return run


def exposition_registry() -> CollectorRegistry:
    """The registry to expose: every worker's files in multiprocess mode, else this process's."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY
