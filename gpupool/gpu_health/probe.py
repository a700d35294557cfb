"""Gathering what ``check.judge`` decides on: gres.conf, the device files, nvidia-smi, the kernel log.

Every program runs through gpupool.proc with a timeout: a hung nvidia-smi is a
finding (the node drains), never a hung health check. The kernel log is read
from /dev/kmsg, the kernel's own record stream: each record carries a sequence
number, so "since the last check" is a number kept in the state file, with no
journald or syslog in between (a node may have neither, or keep no kernel lines).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.errors import CommandNotFound, CommandTimedOut
from gpupool.gpu_health.check import Facts, NvidiaSmiResult, promised_gpu_devices, xid_events
from gpupool.proc import run_command

# Asked of every driver: the health fields, by the names older drivers know too
# (newer ones take clocks_throttle_reasons.* as another name of clocks_event_reasons.*).
QUERY_FIELDS = (
    "index", "pci.bus_id", "name", "temperature.gpu", "ecc.errors.uncorrected.volatile.total",
    "clocks_throttle_reasons.active", "remapped_rows.pending", "remapped_rows.failure",
)
# A driver older than row remapping (before R460) refuses the whole query for one unknown field.
BASIC_QUERY_FIELDS = QUERY_FIELDS[:6]
_MAX_KERNEL_LOG_BYTES = 16 * 1024 * 1024


def query_argv(nvidia_smi: str, fields: Sequence[str] = QUERY_FIELDS) -> list[str]:
    return [nvidia_smi, f"--query-gpu={','.join(fields)}", "--format=csv"]


def unsafe_to_run(path: str) -> str | None:
    """Why root must not run ``path``: it, or a folder above it, can be changed by another user."""
    euid = os.geteuid()
    current = os.path.realpath(path)
    while True:
        info = os.stat(current)
        sticky_folder = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
        if info.st_uid not in (0, euid):
            return f"{current} belongs to uid {info.st_uid}"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_folder:
            return f"{current} is writable by others"
        if current == os.path.dirname(current):
            return None
        current = os.path.dirname(current)


def run_nvidia_smi(nvidia_smi: str, timeout_s: float) -> NvidiaSmiResult:
    """The query's output, or that it timed out or is not installed; a refused field is asked again without it.

    The check runs as root and the nvidia-smi path is a setting: a program another user could
    replace is never run (the node drains, saying why), as sudo refuses such a secure_path.
    """
    if not os.path.exists(nvidia_smi):
        return NvidiaSmiResult(missing=True)
    unsafe = unsafe_to_run(nvidia_smi)
    if unsafe is not None:
        return NvidiaSmiResult(stderr=f"not run: {unsafe}", returncode=126)
    result = _query(nvidia_smi, QUERY_FIELDS, timeout_s)
    if result.returncode != 0 and "not a valid field" in (result.stdout + result.stderr).lower():
        result = _query(nvidia_smi, BASIC_QUERY_FIELDS, timeout_s)
    return result


def _query(nvidia_smi: str, fields: Sequence[str], timeout_s: float) -> NvidiaSmiResult:
    try:
        completed = run_command(query_argv(nvidia_smi, fields), timeout_s=timeout_s, check=False)
    except CommandTimedOut:
        return NvidiaSmiResult(timed_out=True)
    except CommandNotFound as exc:
        return NvidiaSmiResult(stderr=exc.message, returncode=127)
    return NvidiaSmiResult(stdout=completed.stdout, stderr=completed.stderr, returncode=completed.returncode)


def read_promised_devices(gres_conf: str, node_name: str) -> tuple[list[str], str | None]:
    """The device files gres.conf names for the node, or none and why gres.conf could not be read."""
    try:
        with open(gres_conf, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        return [], f"cannot read {gres_conf}: {exc.strerror}"
    return promised_gpu_devices(text, node_name), None


@dataclass(frozen=True)
class KernelRecord:
    sequence: int
    message: str


def parse_kmsg(data: bytes) -> list[KernelRecord]:
    """/dev/kmsg records, ``<priority>,<sequence>,<usec>,<flags>[,...];<message>``; continuation lines skipped."""
    records: list[KernelRecord] = []
    for raw in data.decode("utf-8", errors="replace").splitlines():
        if not raw or raw.startswith(" "):
            continue  # a record's key=value dictionary lines
        prefix, separator, message = raw.partition(";")
        fields = prefix.split(",")
        if not separator or len(fields) < 3 or not fields[1].isdigit():
            continue
        records.append(KernelRecord(int(fields[1]), message))
    return records


def read_kernel_log(path: str) -> bytes:
    """Every record the kernel still holds: /dev/kmsg gives one per read and EAGAIN at the end, a file EOF."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b""
    chunks: list[bytes] = []
    total = 0
    try:
        while total < _MAX_KERNEL_LOG_BYTES:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue  # records overwritten while reading: the next read gives the oldest one left
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def new_xid_events(path: str, after_sequence: int) -> tuple[list[KernelRecord], int]:
    """Kernel records after the cursor, and the cursor to keep (the last record's sequence number)."""
    records = [record for record in parse_kmsg(read_kernel_log(path)) if record.sequence > after_sequence]
    last = max((record.sequence for record in records), default=after_sequence)
    return records, last


def gather(
    *, gres_conf: str, node_name: str, nvidia_smi: str, nvidia_smi_timeout_s: float,
    kernel_log: str, after_sequence: int,
) -> tuple[Facts, int]:
    """The facts of one run, and the kernel-log cursor to save once the verdict is acted on."""
    promised, gres_error = read_promised_devices(gres_conf, node_name)
    missing = [path for path in promised if not os.path.exists(path)]
    records, cursor = new_xid_events(kernel_log, after_sequence)
    facts = Facts(
        promised_devices=promised,
        missing_devices=missing,
        # A node gres.conf promises no GPU (a CPU node) is not judged by what nvidia-smi says.
        nvidia_smi=run_nvidia_smi(nvidia_smi, nvidia_smi_timeout_s) if promised or gres_error else NvidiaSmiResult(missing=True),
        xid_events=xid_events(record.message for record in records),
        gres_conf_error=gres_error,
    )
    return facts, cursor
