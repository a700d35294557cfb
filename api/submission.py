"""From a validated request to a Slurm job, exactly once."""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import Engine, Integer, String, and_, bindparam, delete, func, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql import Executable

from api.context import AppState
from api.metrics import stage
from api.schemas import SubmitRequest
from billing.budgets import WorstCase, check_spend, lock_budget, worst_case
from billing.prices import load_prices
from gpupool.config import Settings, allowed_networks
from gpupool.containers import docker_runtime_refusal
from gpupool.db import UTCDateTime, is_failover_error, utcnow
from gpupool.errors import (
    CommandTimedOut,
    Conflict,
    Forbidden,
    GpupoolError,
    SlurmRejected,
    SlurmUnavailable,
    SubmissionUncertain,
    TooManyJobs,
    Unauthorized,
    ValidationFailed,
)
from gpupool.members import WRITERS, check_member_gpus, check_member_templates, require_role
from gpupool.models import Account, Job, JobSession, JobTask
from gpupool.models.jobs import SUBMITTING
from gpupool.render import ArraySpec, JobSpec, RenderedJob, param_text, render
from gpupool.sessions import new_session
from gpupool.slurm.client import GpuInventory
from gpupool.slurm.runas.request import Sbatch
from gpupool.storage.paths import account_storage_dir
from gpupool.templates import Template
from gpupool.tokens import Principal
from gpupool.webhooks.destinations import check_destination
from gpupool.webhooks.endpoints import add_job_callback

log = logging.getLogger("gpupool.submit")
# Slurm's words for ESLURM_INVALID_QOS (slurm_errtab.c), as sbatch prints them.
_INVALID_QOS = "Invalid qos specification"
# ESLURM_ACCOUNTING_POLICY's: any association or QOS limit a job breaks at submit, GrpSubmitJobs among them.
_ACCOUNTING_POLICY = "Job violates accounting/QOS policy"


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
        refusal = docker_runtime_refusal(settings)
        if refusal is not None:
            raise ValidationFailed(refusal, code="container_runtime_unsafe")
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
    _check_share(settings, inventory, req, gpus)


def _check_share(settings: Settings, inventory: GpuInventory, req: SubmitRequest, gpus: int) -> None:
    """Refuse CPUs or memory beyond the job's GPUs' share, which would leave a node's other GPUs unusable."""
    share = inventory.share_by_type.get(req.gpu_type) if req.gpu_type else inventory.share
    cpus_per_gpu = settings.max_cpus_per_gpu or (share.cpus if share else None)
    # Slurm's MB are MiB, and --mem=<n>G means n x 1024 of them.
    mem_gb_per_gpu = settings.max_mem_gb_per_gpu or (share.mem_mb // 1024 if share else None)
    caps = (
        ("cpus", req.cpus, cpus_per_gpu, settings.default_cpus, "CPU(s)"),
        ("mem_gb", req.mem_gb, mem_gb_per_gpu, settings.default_mem_gb, "GB"),
    )
    for field_name, asked, per_gpu, default, unit in caps:
        if asked is None or per_gpu is None:
            continue
        # A job without GPUs still occupies a node: it gets one GPU's share. What
        # leaving the field out gives is never refused when asked for by name.
        allowed = max(max(gpus, 1) * per_gpu, default)
        if asked > allowed:
            raise ValidationFailed(
                f"{field_name} may be at most {allowed} for {gpus} GPU(s): this cluster allows "
                f"{per_gpu} {unit} per GPU, so that no job leaves another GPU of its node idle"
            )


def _job_with_key(session: Session, account: str, owner: str, key: str) -> Job | None:
    return session.scalars(
        select(Job).where(Job.account == account, Job.owner == owner, Job.idempotency_key == key)
    ).one_or_none()


# The caller's account and the job its Idempotency-Key made, if any: one statement, built once.
_ACCOUNT_AND_KEYED_JOB = (
    select(Account, Job)
    .outerjoin(
        Job,
        and_(
            Job.account == Account.name,
            Job.owner == bindparam("admit_owner", type_=String),
            Job.idempotency_key == bindparam("admit_key", type_=String),
        ),
    )
    .where(Account.name == bindparam("admit_account", type_=String))
)


def _account_and_keyed_job(session: Session, caller: Principal, key: str | None) -> tuple[Account | None, Job | None]:
    """The caller's account and, when the request has an Idempotency-Key, the job that key made: one query."""
    if key is None:
        return session.get(Account, caller.account), None
    row = session.execute(
        _ACCOUNT_AND_KEYED_JOB, {"admit_owner": caller.sub, "admit_key": key, "admit_account": caller.account}
    ).one_or_none()
    return (None, None) if row is None else (row[0], row[1])


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
    found = app.slurm.find_by_tag(job.tag, job.account, job.unix_user)
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
    rendered = render(_spec(app, job))
    job.submit_attempted_at = utcnow()
    session.commit()
    record = session.get(JobSession, job.id) if app.templates[job.template].session is not None else None
    _run_sbatch(app, session, job, rendered, None if record is None else record.secret)


def _array_spec(job: Job) -> ArraySpec | None:
    if job.array_size is None:
        return None
    sweep = job.sweep or {}
    return ArraySpec(
        count=job.array_size,
        max_parallel=job.array_max_parallel,
        sweep_param=sweep.get("param"),
        sweep_values=tuple(param_text(value) for value in sweep.get("values", ())),
    )


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
        session_ports=app.settings.session_ports if template.session is not None else None,
        array=_array_spec(job),
        preemptible=job.preemptible,
        requeue_on_failure=job.requeue_on_failure,
        data_dir=account_storage_dir(app.settings.storage_root, job.account) if app.settings.storage_root else None,
    )


def _queued_jobs(session: Session, account: str) -> int:
    """The account's jobs pending or running as the database knows them, each array task counted, as Slurm counts."""
    single = select(func.count()).select_from(Job).where(
        Job.account == account, Job.finished.is_(False), Job.array_size.is_(None)
    )
    tasks = (
        select(func.count())
        .select_from(JobTask)
        .join(Job, Job.id == JobTask.job_id)
        .where(Job.account == account, JobTask.finished.is_(False))
    )
    return int(session.scalar(single) or 0) + int(session.scalar(tasks) or 0)


def _explained(app: AppState, session: Session, refusal: SlurmRejected, job: Job) -> GpupoolError | None:
    """Slurm's refusal of ``job`` with what to do, where Slurm's words alone would not say it; None elsewhere.

    Asked only once Slurm has refused, so a submit Slurm takes pays for none of it.
    """
    if job.preemptible and _INVALID_QOS in refusal.message:
        # An association made before spot jobs existed allows QOS normal alone.
        return SlurmRejected(
            f"{refusal.message}. A spot job runs under QOS spot, which this account's Slurm association does not "
            f"allow yet (accounts created before spot jobs existed lack it): ask your operator to run "
            f"`gpupool account create {job.account}` again, or submit without preemptible",
            code="spot_not_enabled",
        )
    if _ACCOUNTING_POLICY in refusal.message:
        account = session.get(Account, job.account)
        limit = app.settings.max_submit_jobs if account is None else account.submit_job_limit(app.settings.max_submit_jobs)
        in_use, asked = _queued_jobs(session, job.account), job.array_size or 1
        if in_use + asked > limit:
            return TooManyJobs(
                f"account {job.account!r} may have at most {limit} jobs pending or running at once, each array task "
                f"counted as one; it has {in_use} and this submit asks for {asked} more: wait for some to end, or ask "
                "the operator to raise the account's limit",
                limit=limit, in_use=in_use, asked=asked,
            )
    return None


def _forget(app: AppState, session: Session, job: Job) -> None:
    """Drop a job Slurm never took, so its Idempotency-Key can be used again."""
    record = session.get(JobSession, job.id)
    if record is not None:
        session.delete(record)
        session.flush()
    session.execute(delete(JobTask).where(JobTask.job_id == job.id))
    session.delete(job)
    session.commit()
    try:
        # The folder is the tenant's: only the run-as helper may remove it.
        app.slurm.tenants.discard(job.account, job.id)
    except GpupoolError as exc:
        log.warning("job %s: could not remove the folder of a job Slurm refused: %s", job.id, exc.message)


def _run_sbatch(app: AppState, session: Session, job: Job, rendered: RenderedJob, session_secret: str | None) -> None:
    """Submit a job whose row is already committed, as the user it records (its owner's, or the account's); record the Slurm job id.

    ``session_secret`` is the session's, for a session template (None otherwise): the caller
    has it, so an ordinary submit asks the database nothing more between its commit and sbatch.
    """
    try:
        with stage("sbatch"):  # the run-as helper, and sbatch as the tenant
            slurm_job_id = app.slurm.submit(
                Sbatch(
                    job.account, job.id, rendered.script, rendered.options, session_secret=session_secret,
                    array_values=rendered.array_values, user=job.unix_user,
                )
            )
    except (CommandTimedOut, SubmissionUncertain) as exc:
        # sbatch may still have reached slurmctld: never guess, look for the tag.
        try:
            found = app.slurm.find_by_tag(job.tag, job.account, job.unix_user)
        except SlurmUnavailable:
            found = None
        if found is None:
            log.warning("job %s (account %s): %s; the tag is not in the queue yet", job.id, job.account, exc.message)
            raise SlurmUnavailable(
                "Slurm's answer to the submission did not arrive; the job may still be accepted. Poll it, or retry "
                "with the same Idempotency-Key, which never submits it twice",
                job_id=job.id,
            ) from exc
        slurm_job_id = found
    except SlurmUnavailable as exc:
        # The connect failed, or slurmctld answered "not now": nothing was submitted.
        log.warning("job %s (account %s) not submitted: %s", job.id, job.account, exc.message)
        _forget(app, session, job)
        raise
    except SlurmRejected as exc:
        log.info("job %s (account %s) refused by Slurm: %s", job.id, job.account, exc.message)
        _forget(app, session, job)
        explained = _explained(app, session, exc, job)
        if explained is None:
            raise
        raise explained from exc
    log.info("job %s submitted as Slurm job %s (account %s, %s x gpu)", job.id, slurm_job_id, job.account, job.gpus)
    with stage("record"):
        try:
            _record_submitted(session, job, slurm_job_id)
        except DBAPIError as exc:
            if not is_failover_error(exc):
                raise
            # The database went away (or read-only: a failover) between the row's commit and this
            # update. The job is in Slurm and its row, committed before sbatch, carries its tag:
            # the refresher adopts it by that tag once the database is back (jobstate's
            # _submission_values), so the submit is answered 201 rather than retried into a twin.
            log.warning(
                "job %s submitted as Slurm job %s, but its id was not recorded (%s); the refresher adopts it by its tag",
                job.id, slurm_job_id, exc.orig,
            )
            session.expunge(job)  # kept as loaded: a rollback would expire it, and reloading needs the database
            session.rollback()
            _note_submitted(job, slurm_job_id, job.submitted_at or utcnow(), utcnow())


# Built once, its values bound at each execution: building the UPDATE anew cost
# about 0.3 ms of the worker's CPU per submit (SQLAlchemy caches the SQL it
# compiles, not the statement's objects). On PostgreSQL the statement is
# committed without waiting for the disk: only a PostgreSQL crash within
# wal_writer_delay can lose this update, and then the refresher still finds the
# job by its tag; the row itself was committed durably before sbatch.
# set_config(..., true) is SET LOCAL as a function: in the UPDATE's own
# RETURNING it costs no round trip of its own.
_RECORD = (
    update(Job)
    .where(Job.id == bindparam("record_job_id", type_=String))
    .values(
        slurm_job_id=bindparam("record_slurm_job_id", type_=Integer),
        state="PENDING",
        submitted_at=bindparam("record_submitted_at", type_=UTCDateTime),
        updated_at=bindparam("record_updated_at", type_=UTCDateTime),
    )
)
_RECORD_ASYNC_COMMIT = _RECORD.returning(func.set_config("synchronous_commit", "off", True))


def _record_submitted(session: Session, job: Job, slurm_job_id: int) -> None:
    """Store Slurm's job id on the committed row (and on ``job``): one UPDATE, not the ORM's flush of a changed object."""
    now = utcnow()
    submitted_at = job.submitted_at or now
    params = {
        "record_job_id": job.id, "record_slurm_job_id": slurm_job_id,
        "record_submitted_at": submitted_at, "record_updated_at": now,
    }
    bind = session.get_bind()
    if bind.dialect.name == "postgresql" and isinstance(bind, Engine):
        _execute_alone(session, _RECORD_ASYNC_COMMIT, params)
    else:
        # SQLite, or a session joined to its caller's transaction (the tests'), which it cannot leave.
        statement = _RECORD_ASYNC_COMMIT if bind.dialect.name == "postgresql" else _RECORD
        session.connection().execute(statement, params).close()
        session.commit()
    _note_submitted(job, slurm_job_id, submitted_at, now)


def _note_submitted(job: Job, slurm_job_id: int, submitted_at: dt.datetime, now: dt.datetime) -> None:
    """What the submit answers, on ``job`` without a flush: Slurm's id and PENDING."""
    values = {"slurm_job_id": slurm_job_id, "state": "PENDING", "submitted_at": submitted_at, "updated_at": now}
    for name, value in values.items():
        set_committed_value(job, name, value)


def _execute_alone(session: Session, statement: Executable, params: dict[str, Any]) -> None:
    """``statement`` as a transaction of its own, in one round trip.

    The driver's autocommit sends it without a BEGIN and a COMMIT of their own
    (three round trips become one). The flag is psycopg2's and costs nothing to
    set and clear, where SQLAlchemy's AUTOCOMMIT isolation level costs another
    round trip to undo. It is set between transactions only: a replay may have
    read in one, which is ended first.
    """
    session.commit()
    connection = session.connection()
    driver = connection.connection.dbapi_connection
    assert driver is not None
    driver.autocommit = True
    try:
        connection.execute(statement, params).close()
    finally:
        if not driver.closed:  # a server gone mid-statement closed it: setting the flag would raise over the error
            driver.autocommit = False
    session.commit()


@dataclass(frozen=True)
class _ArrayShape:
    """What a request's ``array`` and ``sweep`` ask for, checked against the template and the operator's bound."""

    count: int
    max_parallel: int | None
    param: str | None
    values: list[Any]


def _array_shape(settings: Settings, template: Template, req: SubmitRequest) -> tuple[dict[str, Any], _ArrayShape | None]:
    """The job's own params and its array shape (None: a single job)."""
    if req.array is None and req.sweep is None:
        return template.validate_params(req.params), None
    if template.session is not None:
        raise ValidationFailed(f"template {req.template!r} runs interactive sessions, which cannot be array jobs")
    limit = settings.max_array_tasks
    max_parallel = req.array.max_parallel if req.array is not None else None
    count = req.array.count if req.array is not None else None
    if req.sweep is None:
        if count is None:
            raise ValidationFailed("array.count is required without a sweep")
        if count > limit:
            raise ValidationFailed(f"array.count may be at most {limit} on this cluster", max_array_tasks=limit)
        return template.validate_params(req.params), _ArrayShape(count, max_parallel, None, [])
    if len(req.sweep) != 1:
        raise ValidationFailed("sweep names exactly one parameter: {\"param\": [v1, v2, ...]}")
    ((param, raw_values),) = req.sweep.items()
    if param not in template.params_model.model_fields:
        raise ValidationFailed(f"template {req.template!r} has no parameter {param!r} to sweep")
    if param in req.params:
        raise ValidationFailed(f"param {param!r} is swept: give its values in sweep only, not in params too")
    if not raw_values:
        raise ValidationFailed("a sweep needs at least one value")
    if len(raw_values) > limit:
        raise ValidationFailed(f"a sweep may have at most {limit} values on this cluster", max_array_tasks=limit)
    if count is not None and count != len(raw_values):
        raise ValidationFailed(f"array.count is {count} but the sweep has {len(raw_values)} values; give one or the other")
    values: list[Any] = []
    params: dict[str, Any] = {}
    for index, raw in enumerate(raw_values):
        try:
            validated = template.validate_params({**req.params, param: raw})
        except ValidationFailed as exc:
            raise ValidationFailed(f"sweep value {index}: {exc.message}", **exc.details) from exc
        value = validated.pop(param)
        text_value = param_text(value)
        if "\x00" in text_value:
            raise ValidationFailed(f"sweep value {index} contains a NUL character, which no file a task reads can carry")
        values.append(value)
        params = validated
    return params, _ArrayShape(len(values), max_parallel, param, values)


@dataclass(frozen=True)
class _Admitted:
    """A request past every check that needs no Slurm answer: what a submit and a quote both start from."""

    params: dict[str, Any]
    gpus: int
    account: Account
    keyed_job: Job | None
    time_limit_min: int
    array: _ArrayShape | None


def _admit(
    app: AppState, session: Session, caller: Principal, req: SubmitRequest, idempotency_key: str | None
) -> _Admitted:
    """The template, account and resource checks of a submit, in its order; raises what a submit would."""
    template = app.templates.get(req.template)
    if template is None:
        raise ValidationFailed(
            f"unknown template {req.template!r}; see GET /templates", allowed=sorted(app.templates)
        )
    params, array = _array_shape(app.settings, template, req)
    if template.session is None and req.idle_timeout_min is not None:
        raise ValidationFailed(f"idle_timeout_min applies to session templates only; {req.template!r} is not one")
    if req.preemptible and app.settings.container_runtime == "docker" and req.container_image is not None:
        raise ValidationFailed("a docker job cannot be preemptible on this cluster: its container would not survive the requeue")
    if req.preemptible and (req.array is not None or req.sweep is not None):
        raise ValidationFailed("an array job cannot be preemptible yet: submit its tasks at full price, or as single spot jobs")
    if template.session is not None and req.preemptible:
        raise ValidationFailed(f"a session cannot be preemptible: a requeue would end it; {req.template!r} is a session template")
    if req.requeue_on_failure and template.session is not None:
        raise ValidationFailed(f"a session cannot be requeued: it would start again with a new link; {req.template!r} is a session template")
    if req.requeue_on_failure and (req.array is not None or req.sweep is not None):
        raise ValidationFailed("an array job cannot ask for requeue_on_failure yet: submit its tasks as single jobs")
    if req.requeue_on_failure and app.settings.container_runtime == "docker" and req.container_image is not None:
        raise ValidationFailed("a docker job cannot be requeued on this cluster: its container would not survive the requeue")
    gpus = req.gpus if req.gpus is not None else template.default_gpus
    if gpus < template.min_gpus:
        raise ValidationFailed(f"template {req.template!r} needs at least {template.min_gpus} GPU(s)")
    account, keyed_job = _account_and_keyed_job(session, caller, idempotency_key)
    if account is None:
        raise Forbidden(f"account {caller.account!r} does not exist; ask the operator to create it")
    if account.disabled_at is not None:
        # The token cache may not have seen the disable yet; the submit path reads the row anyway.
        raise Unauthorized(f"account {account.name!r} is disabled", code="account_disabled")
    if account.gpu_limit is not None and gpus > account.gpu_limit:
        raise ValidationFailed(f"account {account.name!r} may use at most {account.gpu_limit} GPU(s) at once")
    if caller.membership is not None:
        # The pages reach here without the API's per-endpoint check.
        require_role(caller.membership, WRITERS)
        check_member_templates(caller.membership, req.template)
    time_limit_min = req.time_limit_min or app.settings.default_time_limit_min
    return _Admitted(params, gpus, account, keyed_job, time_limit_min, array)


def _check_budget(app: AppState, session: Session, caller: Principal, admitted: _Admitted, req: SubmitRequest) -> None:
    """The 402 checks, the member's and the account's; hold the account's budget lock until the session's transaction ends."""
    account = admitted.account
    tasks = admitted.array.count if admitted.array is not None else 1
    membership = caller.membership if caller.membership is not None and caller.membership.has_limits else None
    budgeted = account.prepaid_credit_nanos is not None or account.monthly_limit_nanos is not None
    if membership is None and not budgeted:
        return
    member_limit = membership.monthly_limit_nanos if membership is not None else None
    now = app.clock()
    # The one lock of the account's budget: a member's concurrent submits see each other's jobs too.
    lock = lock_budget(session, account.name, now, member=caller.sub if member_limit is not None else None)
    if membership is not None:
        asked = admitted.gpus * min(tasks, admitted.array.max_parallel or tasks) if admitted.array is not None else admitted.gpus
        check_member_gpus(session, membership, account.name, caller.sub, asked)
    check_spend(
        session, lock, gpus=admitted.gpus, gpu_type=req.gpu_type, time_limit_min=admitted.time_limit_min,
        currency=app.settings.currency, now=now, tasks=tasks, preemptible=req.preemptible, member_limit_nanos=member_limit,
    )


def _new_job(
    app: AppState, caller: Principal, req: SubmitRequest, admitted: _Admitted, idempotency_key: str | None, fingerprint: str
) -> Job:
    settings = app.settings
    job_id = str(uuid.uuid4())
    # The member's own user when the operator has made one (read with the caller's
    # membership, no query of its own); else the account's tenant user.
    membership = caller.membership
    return Job(
        id=job_id,
        account=caller.account,
        owner=caller.sub,
        unix_user=membership.unix_user if membership is not None else None,
        unix_uid=membership.unix_uid if membership is not None else None,
        name=req.name or req.template,
        template=req.template,
        params=admitted.params,
        gpus=admitted.gpus,
        gpu_type=req.gpu_type,
        cpus=req.cpus or settings.default_cpus,
        mem_gb=req.mem_gb or settings.default_mem_gb,
        time_limit_min=admitted.time_limit_min,
        container_image=req.container_image,
        preemptible=req.preemptible,
        requeue_on_failure=req.requeue_on_failure,
        job_dir=str(Path(settings.job_root) / caller.account / job_id),
        state=SUBMITTING,
        finished=False,
        idempotency_key=idempotency_key,
        request_hash=fingerprint,
        submit_attempted_at=utcnow(),
        array_size=admitted.array.count if admitted.array is not None else None,
        array_max_parallel=admitted.array.max_parallel if admitted.array is not None else None,
        sweep={"param": admitted.array.param, "values": admitted.array.values} if admitted.array is not None and admitted.array.param is not None else None,
    )


@dataclass(frozen=True)
class Quote:
    """What a submit of this request would cost at most, and when Slurm would start it; nothing was created."""

    gpus: int
    gpu_type: str | None
    time_limit_min: int
    cost: WorstCase
    currency: str
    estimated_start: dt.datetime | None


def quote(app: AppState, session: Session, caller: Principal, req: SubmitRequest) -> Quote:
    """A dry run of ``submit``: its checks and refusals, then ``sbatch --test-only`` as the tenant.

    No row, no folder, no Slurm job: the job id in the rendered script is made
    for this call and never stored. An Idempotency-Key plays no part; a dry run
    replays nothing and reserves nothing.
    """
    admitted = _admit(app, session, caller, req, None)
    template = app.templates[req.template]
    _check_resources(app, req, admitted.gpus, template.max_gpus)
    try:
        _check_budget(app, session, caller, admitted, req)
        cost = worst_case(
            load_prices(session), gpus=admitted.gpus, gpu_type=req.gpu_type, time_limit_min=admitted.time_limit_min,
            now=app.clock(), tasks=admitted.array.count if admitted.array is not None else 1, preemptible=req.preemptible,
        )
    finally:
        session.rollback()  # ends the budget lock before Slurm is asked; nothing was written
    if req.callback_url is not None:
        check_destination(req.callback_url, allowed_networks(app.settings.webhook_allow_cidrs, "webhook_allow_cidrs"))
    job = _new_job(app, caller, req, admitted, None, "")
    rendered = render(_spec(app, job))
    try:
        estimated = app.slurm.test_submit(Sbatch(job.account, job.id, rendered.script, rendered.options, user=job.unix_user))
    except SlurmRejected as exc:
        explained = _explained(app, session, exc, job)
        if explained is None:
            raise
        raise explained from exc
    return Quote(admitted.gpus, req.gpu_type, admitted.time_limit_min, cost, app.settings.currency, estimated)


class Submitted(NamedTuple):
    job: Job
    replayed: bool
    # A new job's callback endpoint's secret, kept from its insert: the answer needs no read after
    # sbatch (the database may be gone by then). None without a callback_url, or on a replay.
    callback_secret: str | None = None


def submit(
    app: AppState,
    session: Session,
    caller: Principal,
    req: SubmitRequest,
    raw_body: dict[str, Any],
    idempotency_key: str | None,
) -> Submitted:
    """Create and submit the job; returns (job, replayed, callback secret)."""
    with stage("admit"):
        admitted = _admit(app, session, caller, req, idempotency_key)
    fingerprint = request_fingerprint(raw_body)
    if admitted.keyed_job is not None:
        return Submitted(_replay(app, session, admitted.keyed_job, fingerprint), True)

    template = app.templates[req.template]
    _check_resources(app, req, admitted.gpus, template.max_gpus)
    with stage("budget"):
        _check_budget(app, session, caller, admitted, req)
    with stage("render"):
        job = _new_job(app, caller, req, admitted, idempotency_key, fingerprint)
        rendered = render(_spec(app, job))
    session.add(job)
    if admitted.array is not None:
        job.task_states = {"PENDING": admitted.array.count}
        session.flush()  # the job row first, as for a session
        session.add_all(
            JobTask(job_id=job.id, task_index=index, state="PENDING", finished=False) for index in range(admitted.array.count)
        )
    record = None
    if template.session is not None:
        session.flush()  # the job row first: the models declare no relationships to order the inserts
        record = new_session(job.id, template, req.idle_timeout_min)
        session.add(record)
    callback_secret = None
    if req.callback_url is not None:
        callback_secret = add_job_callback(app.settings, session, job, req.callback_url).secret
    try:
        with stage("commit"):
            session.commit()  # the one durable write before sbatch: a job is never untracked
    except IntegrityError:
        # The same key raced us from another request; answer as its replay.
        session.rollback()
        assert idempotency_key is not None
        existing = _job_with_key(session, caller.account, caller.sub, idempotency_key)
        if existing is None:
            raise
        return Submitted(_replay(app, session, existing, fingerprint), True)
    _run_sbatch(app, session, job, rendered, None if record is None else record.secret)
    return Submitted(job, False, callback_secret)
