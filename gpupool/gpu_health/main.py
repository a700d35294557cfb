"""``gpupool-gpu-check``: Slurm's HealthCheckProgram on every GPU node.

    gpupool-gpu-check [--config /etc/slurm/gpupool-gpu-check.json] [--dry-run]

Runs as root (slurmd's user) every HealthCheckInterval. A healthy node: prints
nothing and exits 0. Warnings: printed, exit 0. A failing verdict: the node is
drained (``scontrol update nodename=<node> state=drain reason="gpu: ..."``) and
the check exits 1; no new jobs start, and running jobs finish, but those holding
a GPU that failed outright (lost, an Xid that drains, ...), which are ended at
once, requeued where the job allows it (``requeue_on_failure``, spot; ``gpupool.gpu_health.jobs``). The check never
resumes a node: ``gpupool node resume <node>`` (or scontrol) does, once the
operator is satisfied. A node already drained or down keeps the reason it has.

Exit status: 0 healthy (or warnings only, or another run holds the lock);
1 drained (--dry-run: would drain); 2 the config cannot be read, or scontrol failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from gpupool.errors import CommandFailed, CommandTimedOut
from gpupool.gpu_health.check import Finding, Thresholds, Verdict, judge, parse_query_csv
from gpupool.gpu_health.jobs import gpu_indices, held_gpus, hits
from gpupool.gpu_health.probe import gather
from gpupool.gpu_health.state import CheckState, exclusive_run, load_state, save_state
from gpupool.proc import run_command

DEFAULT_CONFIG = "/etc/slurm/gpupool-gpu-check.json"
CONFIG_ENV = "GPUPOOL_GPU_CHECK_CONFIG"
EXIT_DRAINED, EXIT_BROKEN = 1, 2
# Slurm keeps a node's reason whole, but sinfo and squeue cut it; the first cause fits.
MAX_REASON_CHARS = 200


@dataclass(frozen=True)
class CheckConfig:
    """The check's config file (JSON), which the playbook renders from the slurm_compute role's defaults."""

    node_name: str = ""
    gres_conf: str = "/etc/slurm/gres.conf"
    nvidia_smi: str = "/usr/bin/nvidia-smi"
    nvidia_smi_timeout_s: float = 10.0
    scontrol: str = "/usr/bin/scontrol"
    scontrol_timeout_s: float = 10.0
    squeue: str = "/usr/bin/squeue"
    scancel: str = "/usr/bin/scancel"
    # False: a failed GPU drains the node and its jobs are left to end by themselves.
    end_jobs: bool = True
    # Jobs of these QOS (comma-separated) are requeued, not cancelled, when their GPU fails; so is
    # any job Slurm may requeue (squeue's "requeue": sbatch --requeue, gpupool's requeue_on_failure).
    requeue_qos: str = "spot"
    kernel_log: str = "/dev/kmsg"
    boot_id_file: str = "/proc/sys/kernel/random/boot_id"
    state_dir: str = "/var/lib/gpupool/gpu-check"
    # False: judge and print, never drain (a site trying the check out first).
    drain: bool = True
    temperature_warn_c: float = Thresholds.temperature_warn_c
    temperature_drain_c: float = Thresholds.temperature_drain_c
    throttle_drain_after_checks: int = Thresholds.throttle_drain_after_checks

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(self.temperature_warn_c, self.temperature_drain_c, self.throttle_drain_after_checks)

    def resolved_node_name(self) -> str:
        """The Slurm node name: the one slurmd passes its health check, else the config's, else the short host name."""
        return os.environ.get("SLURMD_NODENAME", "") or self.node_name or socket.gethostname().split(".")[0]


class ConfigUnreadable(Exception):
    pass


def load_config(path: str) -> CheckConfig:
    """The file's settings over the defaults; a missing file means every default; an unknown key is refused."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw: Any = json.load(handle)
    except FileNotFoundError:
        return CheckConfig()
    except (OSError, ValueError) as exc:
        raise ConfigUnreadable(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigUnreadable(f"{path} must hold a JSON object")
    known = {item.name: item.type for item in fields(CheckConfig)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigUnreadable(f"{path}: unknown setting(s) {', '.join(unknown)}")
    defaults = CheckConfig()
    values: dict[str, Any] = {}
    for name, value in raw.items():
        expected = type(getattr(defaults, name))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigUnreadable(f"{path}: {name} must be a {expected.__name__}")
        values[name] = value
    return CheckConfig(**values)


def _boot_id(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def node_is_out_of_service(config: CheckConfig, node: str) -> bool:
    """True when Slurm already has the node drained or down: its reason (an operator's, or an earlier check's) stays."""
    result = run_command(
        [config.scontrol, "--oneliner", "show", "node", node], timeout_s=config.scontrol_timeout_s, check=False
    )
    for word in result.stdout.split():
        if word.startswith("State="):
            state = word.removeprefix("State=")
            return any(flag in state for flag in ("DRAIN", "DOWN", "FAIL"))
    return False


def drain(config: CheckConfig, node: str, reason: str) -> None:
    run_command(
        [config.scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason[:MAX_REASON_CHARS]}"],
        timeout_s=config.scontrol_timeout_s,
    )


def end_failed_gpu_jobs(config: CheckConfig, node: str, findings: tuple[Finding, ...], indices: dict[str, int]) -> None:
    """Record the failure in each hit job's AdminComment, then requeue or cancel it (gpupool.gpu_health.jobs)."""
    if not any(finding.failed_gpu for finding in findings):
        return
    now = dt.datetime.now(dt.timezone.utc)  # noqa: UP017 (the node's python3 may be 3.10)
    try:
        listing = run_command([config.squeue, "--json"], timeout_s=config.scontrol_timeout_s)
        held = held_gpus(listing.stdout, node)
    except (CommandFailed, CommandTimedOut) as exc:
        print(f"gpupool-gpu-check: {node}: cannot list the jobs on the failed GPU ({exc.message})", file=sys.stderr)
        return
    except (ValueError, KeyError, TypeError) as exc:
        print(f"gpupool-gpu-check: {node}: cannot read squeue --json ({exc})", file=sys.stderr)
        return
    requeue_qos = frozenset(filter(None, (qos.strip().lower() for qos in config.requeue_qos.split(","))))
    ended, unknown = hits(findings, indices, held, node=node, now=now, requeue_qos=requeue_qos)
    for gpu in unknown:
        print(f"gpupool-gpu-check: {node}: no Slurm index known for {gpu}; its jobs are left running", file=sys.stderr)
    for hit in ended:
        action = "requeue" if hit.requeue else "cancel"
        try:
            run_command(
                [config.scontrol, "update", f"jobid={hit.job_id}", f"admincomment={hit.failure.comment()}"],
                timeout_s=config.scontrol_timeout_s,
            )
            command = [config.scontrol, "requeue", str(hit.job_id)] if hit.requeue else [config.scancel, str(hit.job_id)]
            run_command(command, timeout_s=config.scontrol_timeout_s)
        except (CommandFailed, CommandTimedOut) as exc:
            print(f"gpupool-gpu-check: {node}: could not {action} job {hit.job_id} ({exc.message})", file=sys.stderr)
            continue
        done = "requeued" if hit.requeue else "cancelled"
        print(f"gpupool-gpu-check: {node}: job {hit.job_id}: {done}: {hit.failure.reason}", file=sys.stderr)


def _report(verdict: Verdict, node: str) -> None:
    for finding in verdict.findings:
        print(f"gpupool-gpu-check: {node}: {finding.action}: {finding.reason}", file=sys.stderr)


def run_check(config: CheckConfig, *, dry_run: bool) -> int:
    node = config.resolved_node_name()
    with exclusive_run(config.state_dir) as holding:
        if not holding:
            print(f"gpupool-gpu-check: {node}: another check is running; leaving this one to it", file=sys.stderr)
            return 0
        state = load_state(config.state_dir)
        boot_id = _boot_id(config.boot_id_file)
        after = state.kernel_sequence if state.boot_id == boot_id else -1
        facts, cursor = gather(
            gres_conf=config.gres_conf, node_name=node, nvidia_smi=config.nvidia_smi,
            nvidia_smi_timeout_s=config.nvidia_smi_timeout_s, kernel_log=config.kernel_log, after_sequence=after,
        )
        verdict = judge(facts, config.thresholds, state.throttle_streaks)
        readings = parse_query_csv(facts.nvidia_smi.stdout) if not facts.nvidia_smi.timed_out else []
        indices = {**state.gpu_indices, **gpu_indices(facts.promised_devices, readings)}
        _report(verdict, node)
        status = 0
        reason = verdict.drain_reason
        if reason is not None:
            status = EXIT_DRAINED
            if dry_run or not config.drain:
                print(f"gpupool-gpu-check: {node}: would drain: {reason}", file=sys.stderr)
            else:
                try:
                    if node_is_out_of_service(config, node):
                        print(f"gpupool-gpu-check: {node}: already drained or down; its reason stays", file=sys.stderr)
                    else:
                        drain(config, node, reason)
                        print(f"gpupool-gpu-check: {node}: drained: {reason}", file=sys.stderr)
                except (CommandFailed, CommandTimedOut) as exc:
                    # The cursor stays where it was: the next run sees the same Xid lines and tries again.
                    print(f"gpupool-gpu-check: {node}: could not drain ({exc.message})", file=sys.stderr)
                    return EXIT_BROKEN
                if config.end_jobs:
                    end_failed_gpu_jobs(config, node, verdict.findings, indices)
        save_state(config.state_dir, CheckState(
            boot_id=boot_id, kernel_sequence=cursor, throttle_streaks=dict(verdict.throttle_streaks),
            last_findings=[{"action": f.action, "reason": f.reason} for f in verdict.findings],
            gpu_indices={key: value for key, value in indices.items() if not key.startswith("/")},
        ))
        return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool-gpu-check", description="Drain this Slurm node when a GPU fails.")
    parser.add_argument(
        "--config", default=os.environ.get(CONFIG_ENV, DEFAULT_CONFIG), help=f"JSON settings (default {DEFAULT_CONFIG})"
    )
    parser.add_argument("--dry-run", action="store_true", help="judge and print, never drain")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigUnreadable as exc:
        print(f"gpupool-gpu-check: {exc}", file=sys.stderr)
        return EXIT_BROKEN
    return run_check(config, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
