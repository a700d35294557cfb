"""Synthetic sacct dumps: the worker's --parsable2 format, and the seed article's input format.

Deterministic for a given seed. Job names include '|' and newlines now and
then, as customers' names do; a tenth of the jobs never start or hold no GPU.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from dataclasses import dataclass

from billing.sacct import SACCT_FIELDS

_TYPES = ("rtx4090", "rtx3090")
_NAMES = ("train", "infer", "sweep|lr=3e-4", "eval\nsecond line", "llama-7b-ft", "a'; echo foo")


@dataclass(frozen=True)
class SyntheticJob:
    job_id: int
    account: str
    state: str
    submit: dt.datetime
    start: dt.datetime | None
    elapsed_s: int
    gpus: int
    gpu_type: str
    name: str


def synthetic_jobs(count: int, *, seed: int = 7, month_start: dt.datetime | None = None, accounts: int = 50) -> Iterator[SyntheticJob]:
    rng = random.Random(seed)
    base = month_start or dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
    for index in range(count):
        submit = base + dt.timedelta(seconds=rng.randrange(0, 29 * 86_400))
        roll = rng.random()
        gpus = rng.choice((1, 1, 1, 2, 2, 4))
        if roll < 0.05:
            state, start, elapsed = "CANCELLED by 1000", None, 0
        else:
            state = "COMPLETED" if roll < 0.85 else rng.choice(("FAILED", "TIMEOUT", "CANCELLED by 0", "OUT_OF_MEMORY"))
            start = submit + dt.timedelta(seconds=rng.randrange(0, 600))
            elapsed = rng.randrange(1, 6 * 3600)
        yield SyntheticJob(
            job_id=1000 + index,
            account=f"acct{index % accounts:03d}",
            state=state,
            submit=submit,
            start=start,
            elapsed_s=elapsed,
            gpus=gpus,
            gpu_type=_TYPES[index % 3 == 0],
            name=_NAMES[index % len(_NAMES)],
        )


def _utc(moment: dt.datetime | None) -> str:
    return "None" if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%S")


# The shape of the billing pass's own delimiter (gpupool.slurm.parse.unpredictable_delimiter), fixed
# here: under "|" the names with a newline below would refuse the dump (billing.sacct).
PASS_DELIMITER = "|5f2a9c7e01bd|"


def sacct_dump(jobs: list[SyntheticJob], cluster: str = "gpupool", delimiter: str = PASS_DELIMITER) -> str:
    """What ``sacct -a -X -D -P --delimiter=<delimiter> -o <SACCT_FIELDS>`` prints for these jobs."""
    lines = [delimiter.join(SACCT_FIELDS)]
    for job in jobs:
        end = job.start + dt.timedelta(seconds=job.elapsed_s) if job.start else job.submit + dt.timedelta(seconds=60)
        tres = (
            f"billing=1,cpu=2,gres/gpu:{job.gpu_type}={job.gpus},gres/gpu={job.gpus},mem=8G,node=1"
            if job.start
            else ""
        )
        fields = [
            cluster,
            str(job.job_id),
            str(job.job_id),
            job.account,
            "alice",
            job.state,
            _utc(job.submit),
            _utc(job.start),
            _utc(end),
            str(job.elapsed_s),
            tres,
            job.name,
        ]
        lines.append(delimiter.join(fields))
    return "\n".join(lines) + "\n"


def seed_dump(jobs: list[SyntheticJob]) -> str:
    """The seed pipeline's input: ``sacct -P -n -o JobID,JobName,Account,AllocCPUS,ReqMem,Elapsed,
    TotalCPU,NNodes,NTasks,Partition,State,ExitCode,ReqGRES`` (no header, Elapsed as H:M:S)."""
    lines = []
    for job in jobs:
        hours, rest = divmod(job.elapsed_s, 3600)
        elapsed = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
        exit_code = "0:0" if job.state == "COMPLETED" else "1:0"
        name = job.name.replace("\n", " ")
        lines.append(
            f"{job.job_id}|{name}|{job.account}|2|8G|{elapsed}|00:00:01|1|1|gpu|{job.state}|{exit_code}|gpu:{job.gpu_type}:{job.gpus}"
        )
    return "\n".join(lines) + "\n"
