"""The record of a GPU failure that ended a job: written by the check, read by billing.

The check (``gpupool.gpu_health.jobs``) writes it into the job's AdminComment
(``scontrol update jobid=X admincomment=...``) before it ends the job. Only
Slurm's operators (root, SlurmUser) can set an AdminComment, so no tenant can
write one; slurmdbd keeps it, and ``sacct --format=...,AdminComment`` shows it
for every run of the job. Billing (``billing.credits``) credits the run that
was running when the failure happened: its start is at or before ``at``. A
requeued job's later runs carry the same comment (Slurm keeps it) but started
after ``at``, so they are billed as usual.

    gpu_failure: Xid 79 on 0000:41:00.0; node=gpu1; gpu=0000:41:00.0; xid=79; at=2026-12-04T23:30:05Z

Standard library only: the playbook copies this module to every compute node.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

PREFIX = "gpu_failure: "
# What the customer reads as the job's end_reason starts with this (gpupool.models.Job.end_reason).
END_REASON_PREFIX = "gpu_failure"
_SEPARATOR = "; "
# Not dt.UTC: the check runs under the node's own python3, which is 3.10 on Ubuntu 22.04.
_UTC = dt.timezone.utc  # noqa: UP017


@dataclass(frozen=True)
class GpuFailure:
    """One failed GPU under one job: where, what, when."""

    reason: str  # the check's finding, e.g. "Xid 79 on 0000:41:00.0", "0000:42:00.0 is lost (fallen off the bus)"
    node: str
    gpu: str  # the GPU's bus id, or the device file gres.conf names
    at: dt.datetime  # UTC, when the check found it
    xid: int | None = None

    def comment(self) -> str:
        """The AdminComment text: one line, no character a tenant chose."""
        words = [f"node={self.node}", f"gpu={self.gpu}"]
        if self.xid is not None:
            words.append(f"xid={self.xid}")
        words.append(f"at={self.at.astimezone(_UTC):%Y-%m-%dT%H:%M:%SZ}")
        return PREFIX + _SEPARATOR.join([_clean(self.reason), *words])

    def end_reason(self) -> str:
        """What the customer reads: ``gpu_failure: Xid 79 on 0000:41:00.0 (node gpu1)``."""
        return f"{END_REASON_PREFIX}: {self.reason} (node {self.node})"


def _clean(text: str) -> str:
    # The reason is the check's own words; a ';' or newline in it would only confuse the reading.
    return " ".join(text.replace(";", ",").split())


def parse_comment(text: str) -> GpuFailure | None:
    """The failure an AdminComment records; None for any other comment (an operator's own, or none)."""
    if not text.startswith(PREFIX):
        return None
    parts = text[len(PREFIX):].strip().split(_SEPARATOR)
    words = dict(part.partition("=")[::2] for part in parts[1:])
    try:
        at = dt.datetime.strptime(words["at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_UTC)
        xid = int(words["xid"]) if "xid" in words else None
    except (KeyError, ValueError):
        return None
    if not words.get("node") or not words.get("gpu"):
        return None
    return GpuFailure(reason=parts[0], node=words["node"], gpu=words["gpu"], at=at, xid=xid)
