"""From a validated request to a Slurm job, exactly once."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.context import AppState
from api.schemas import SubmitRequest
from billing.budgets import check_submit
from gpupool.db import utcnow
from gpupool.errors import (
    CommandTimedOut,
    Conflict,
    Forbidden,
    SlurmRejected,
    SlurmUnavailable,
    ValidationFailed,
)
from gpupool.models import Account, Job
from gpupool.models.jobs import SUBMITTING
from gpupool.render import JobSpec, render
from gpupool.tokens import Principal

log = logging.getLogger("gpupool.submit")


def request_fingerprint(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _check_resources(app: AppState, req: SubmitRequest, gpus: int, template_max: int | None) -> None:
    settings = app.settings
    if template_max is not None and gpus > template_max:
        raise ValidationFailed(f"template {req.template!r} runs on at most {template_max} GPU(s); asked for {gpus}")
    limit = req.time_limit_min or settings.default_time_limit_min
    if limit > settings.max_time_limit_min:
        raise ValidationFailed(f"time_limit_min may be at most {settings.max_time_limit_min}")
    if req.container_image is not None:
        if settings.container_runtime == "none":
            raise ValidationFailed("this cluster runs jobs without containers; omit container_image")
        if not any(fnmatch.fnmatchcase(req.container_image, pattern) for pattern in settings.container_allowlist):
            raise ValidationFailed(
                f"container image {req.container_image!r} is not on the operator's allowlist",
                allowed=list(settings.container_allowlist),
            )
    # Last, since it may ask Slurm: a request that is wrong anyway gets its 422 even while Slurm is away.
    inventory = app.inventory.get()
    if req.gpu_type is not None:
        per_node = inventory.max_per_node_by_type.get(req.gpu_type)
        if per_node is None:
            known = ", ".join(sorted(inventory.max_per_node_by_type)) or "none"
            raise ValidationFailed(f"this cluster has no GPUs of type {req.gpu_type!r}; it has: {known}")
    else:
        per_node = inventory.max_per_node
    if gpus > per_node:
        raise ValidationFailed(
            f"asked for {gpus} GPU(s) but the largest node has {per_node}"
            + (f" of type {req.gpu_type}" if req.gpu_type else "")
        )


def _existing(session: Session, account: str, owner: str, key: str) -> Job | None:
    return session.scalars(
        select(Job).where(Job.account == account, Job.owner == owner, Job.idempotency_key == key)
    ).one_or_none()


def _replay(app: AppState, session: Session, job: Job, fingerprint: str) -> Job:
    if job.request_hash != fingerprint:
        raise Conflict(
            "this Idempotency-Key was already used with a different request body",
            code="idempotency_key_reused",
            job_id=job.id,
        )
    if job.slurm_job_id is None and job.state == SUBMITTING:
        _finish_unknown_submission(app, session, job)
    return job


def _finish_unknown_submission(app: AppState, session: Session, job: Job) -> None:
    """A retry of a submission whose sbatch timed out: find it by tag before trying again."""
    found = app.slurm.find_by_tag(job.tag)
    if found is not None:
        job.slurm_job_id, job.state = found, "PENDING"
        session.commit()
        return
    attempted = job.submit_attempted_at or job.created_at
    # A slow slurmctld may still be working through the first sbatch: only once the
    # grace the refresher also uses has passed is "not found" taken to mean "never sent".
    if utcnow() - attempted <= app.refresher.submission_grace:
        raise SlurmUnavailable(
            "the first submission of this request is still unresolved; retry shortly with the same Idempotency-Key",
            job_id=job.id,
        )
    script = _write_script(app, job)
    job.submit_attempted_at = utcnow()
    session.commit()
    _run_sbatch(app, session, job, script)


def _spec(app: AppState, job: Job) -> JobSpec:
    template = app.templates[job.template]
    return JobSpec(
        job_id=job.id,
        account=job.account,
        name=job.name,
        template=job.template,
        body=template.body,
        params=job.params,
        gpus=job.gpus,
        gpu_type=job.gpu_type,
        cpus=job.cpus,
        mem_gb=job.mem_gb,
        time_limit_min=job.time_limit_min,
        partition=app.settings.slurm_partition,
        job_dir=job.job_dir,
        runtime=app.settings.container_runtime,
        container_image=job.container_image,
        container_mounts=app.settings.container_mounts,
    )


def _write_script(app: AppState, job: Job) -> tuple[Path, tuple[str, ...]]:
    """Write the job's script; return its path and the sbatch options to submit it with."""
    rendered = render(_spec(app, job))
    job_dir = Path(job.job_dir)
    # Logs may hold customer data: no folder on the way is world-readable.
    job_dir.parent.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    for folder in (job_dir.parent, job_dir):
        folder.mkdir(mode=0o750, exist_ok=True)
    script_path = job_dir / "job.sbatch"
    script_path.write_text(rendered.script)
    os.chmod(script_path, 0o640)
    return script_path, rendered.options


def _forget(session: Session, job: Job) -> None:
    """Drop a job Slurm never took, so its Idempotency-Key can be used again."""
    session.delete(job)
    session.commit()
    shutil.rmtree(job.job_dir, ignore_errors=True)


def _run_sbatch(app: AppState, session: Session, job: Job, script: tuple[Path, tuple[str, ...]]) -> None:
    """Submit a job whose row is already committed; record the Slurm job id."""
    script_path, options = script
    try:
        slurm_job_id = app.slurm.submit(options, str(script_path), env_path=app.settings.job_path)
    except CommandTimedOut as exc:
        # sbatch may still have reached slurmctld: never guess, look for the tag.
        try:
            found = app.slurm.find_by_tag(job.tag)
        except SlurmUnavailable:
            found = None
        if found is None:
            log.warning("job %s (account %s): sbatch timed out and the tag is not in the queue yet", job.id, job.account)
            raise SlurmUnavailable(
                "Slurm did not answer in time; the job may still be accepted. Poll it, or retry "
                "with the same Idempotency-Key, which never submits it twice",
                job_id=job.id,
            ) from exc
        slurm_job_id = found
    except SlurmUnavailable as exc:
        # Rejected, or the controller never took the request: nothing was submitted.
        log.warning("job %s (account %s) not submitted: %s", job.id, job.account, exc.message)
        _forget(session, job)
        raise
    except SlurmRejected as exc:
        log.info("job %s (account %s) refused by Slurm: %s", job.id, job.account, exc.message)
        _forget(session, job)
        raise
    job.slurm_job_id = slurm_job_id
    job.state = "PENDING"
    job.submitted_at = job.submitted_at or utcnow()
    log.info("job %s submitted as Slurm job %s (account %s, %s x gpu)", job.id, slurm_job_id, job.account, job.gpus)
    if session.get_bind().dialect.name == "postgresql":
        # Only a PostgreSQL crash within wal_writer_delay can lose this update, and
        # then the refresher still finds the job by its tag; the row itself was
        # committed durably before sbatch. Skipping the flush saves a disk sync.
        session.execute(text("SET LOCAL synchronous_commit TO OFF"))
    session.commit()


def submit(
    app: AppState,
    session: Session,
    caller: Principal,
    req: SubmitRequest,
    raw_body: dict[str, Any],
    idempotency_key: str | None,
) -> tuple[Job, bool]:
    """Create and submit the job; returns (job, replayed)."""
    template = app.templates.get(req.template)
    if template is None:
        raise ValidationFailed(
            f"unknown template {req.template!r}; see GET /templates", allowed=sorted(app.templates)
        )
    params = template.validate_params(req.params)
    gpus = req.gpus if req.gpus is not None else template.default_gpus
    if gpus < template.min_gpus:
        raise ValidationFailed(f"template {req.template!r} needs at least {template.min_gpus} GPU(s)")
    account = session.get(Account, caller.account)
    if account is None:
        raise Forbidden(f"account {caller.account!r} does not exist; ask the operator to create it")
    if account.gpu_limit is not None and gpus > account.gpu_limit:
        raise ValidationFailed(f"account {account.name!r} may use at most {account.gpu_limit} GPU(s) at once")

    fingerprint = request_fingerprint(raw_body)
    if idempotency_key is not None:
        existing = _existing(session, caller.account, caller.sub, idempotency_key)
        if existing is not None:
            return _replay(app, session, existing, fingerprint), True

    _check_resources(app, req, gpus, template.max_gpus)
    settings = app.settings
    time_limit_min = req.time_limit_min or settings.default_time_limit_min
    if account.prepaid_credit_nanos is not None or account.monthly_limit_nanos is not None:
        check_submit(
            session,
            account.name,
            gpus=gpus,
            gpu_type=req.gpu_type,
            time_limit_min=time_limit_min,
            currency=settings.currency,
            now=utcnow(),
        )
    job_id = str(uuid.uuid4())
    job = Job(
        id=job_id,
        account=caller.account,
        owner=caller.sub,
        name=req.name or req.template,
        template=req.template,
        params=params,
        gpus=gpus,
        gpu_type=req.gpu_type,
        cpus=req.cpus or settings.default_cpus,
        mem_gb=req.mem_gb or settings.default_mem_gb,
        time_limit_min=time_limit_min,
        container_image=req.container_image,
        job_dir=str(Path(settings.job_root) / caller.account / job_id),
        state=SUBMITTING,
        finished=False,
        idempotency_key=idempotency_key,
        request_hash=fingerprint,
        submit_attempted_at=utcnow(),
    )
    script = _write_script(app, job)
    session.add(job)
    try:
        session.commit()  # the one durable write before sbatch: a job is never untracked
    except IntegrityError:
        # The same key raced us from another request; answer as its replay.
        session.rollback()
        shutil.rmtree(job.job_dir, ignore_errors=True)
        assert idempotency_key is not None
        existing = _existing(session, caller.account, caller.sub, idempotency_key)
        if existing is None:
            raise
        return _replay(app, session, existing, fingerprint), True
    _run_sbatch(app, session, job, script)
    return job, False
