"""Every error gpupool raises, in one tree.

    GpupoolError
    ├── ConfigError                 settings missing or malformed
    │   ├── PriceMissing            usage of a GPU type that has no price yet
    │   └── TenantError             an account's Unix identity is missing or unsafe to act as
    ├── MigrationRequired           database schema is not at the code's revision
    ├── RequestError                the caller asked for something wrong
    │   ├── BadRequest              malformed body or query (400)
    │   │   └── UnknownFields       fields the schema does not define (400)
    │   ├── Unauthorized            no token, bad token (401)
    │   ├── Forbidden               valid token, not allowed (403)
    │   ├── PaymentRequired         the account's budget cannot cover the job (402)
    │   ├── NotFound                no such resource for this caller (404)
    │   ├── Conflict                state or idempotency clash (409)
    │   │   ├── LogUnavailable      the job's log is a link, FIFO or foreign file (409)
    │   │   └── TooManyJobs         the account holds as many jobs as Slurm lets it queue (409)
    │   ├── LengthRequired          an upload without Content-Length (411)
    │   ├── PayloadTooLarge         body over the configured limit (413)
    │   ├── UnsupportedMediaType    body is not JSON (415)
    │   ├── StorageQuotaExceeded    the account's storage is full: its quota (507)
    │   └── ValidationFailed        well-formed but invalid values (422)
    │       ├── SlurmRejected       Slurm refused the job outright (422)
    │       └── WebhookUrlRefused   a webhook URL that resolves nowhere or inside the network (422)
    └── ServiceUnavailable          a dependency is down or slow (503)
        ├── DatabaseUnavailable
        ├── RunasUnavailable        the run-as helper is not answering on its socket
        ├── StorageUnavailable      the account's storage is not mounted, or failed (I/O error)
        └── SlurmUnavailable
            ├── CommandTimedOut     a Slurm command ran past its timeout
            ├── SubmissionUncertain sbatch failed after slurmctld may have taken the job
            └── CommandFailed       a Slurm command exited non-zero (stderr kept)
                └── CommandNotFound the binary is not where configured

The API maps this tree to HTTP status codes in exactly one place
(``api.errors``); the CLI maps it to exit codes in ``gpupool_cli.main``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


class GpupoolError(Exception):
    """Base of every gpupool error. ``code`` is the stable machine-readable name."""

    code: str = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details: dict[str, Any] = details


class ConfigError(GpupoolError):
    code = "config_error"


class PriceMissing(ConfigError):
    code = "price_missing"


class TenantError(ConfigError):
    code = "tenant_error"


class MigrationRequired(GpupoolError):
    code = "migration_required"


class RequestError(GpupoolError):
    code = "bad_request"


class BadRequest(RequestError):
    code = "bad_request"


class UnknownFields(BadRequest):
    code = "unknown_fields"

    def __init__(self, unknown: Iterable[str], valid: Iterable[str]) -> None:
        super().__init__(
            f"unknown field(s) {', '.join(sorted(unknown))}; "
            f"valid fields are {', '.join(sorted(valid))}",
            unknown=sorted(unknown),
            valid=sorted(valid),
        )


class Unauthorized(RequestError):
    code = "unauthorized"


class Forbidden(RequestError):
    code = "forbidden"


class PaymentRequired(RequestError):
    code = "payment_required"


class NotFound(RequestError):
    code = "not_found"


class Conflict(RequestError):
    code = "conflict"


class LogUnavailable(Conflict):
    """The job left something other than its own regular file where its log belongs.

    A conflict with the job's state, not a missing permission: the caller may
    read the log, but what the job put there is refused rather than followed.
    """

    code = "log_unavailable"


class LengthRequired(RequestError):
    code = "length_required"


class StorageQuotaExceeded(RequestError):
    """The account's filesystem is full: its quota, which the kernel enforces (ENOSPC), whoever writes."""

    code = "storage_quota_exceeded"


class PayloadTooLarge(RequestError):
    code = "payload_too_large"


class UnsupportedMediaType(RequestError):
    code = "unsupported_media_type"


class TooManyJobs(Conflict):
    """The account has as many jobs pending or running as its Slurm association allows (GrpSubmitJobs).

    A conflict with the account's state, not a rate: retrying at once cannot help, so
    no client should treat it as a 429 to retry.
    """

    code = "job_limit_reached"


class ValidationFailed(RequestError):
    code = "validation_failed"


class SlurmRejected(ValidationFailed):
    code = "slurm_rejected"


class WebhookUrlRefused(ValidationFailed):
    code = "webhook_url_refused"


class ServiceUnavailable(GpupoolError):
    code = "service_unavailable"


class DatabaseUnavailable(ServiceUnavailable):
    code = "database_unavailable"


class RunasUnavailable(ServiceUnavailable):
    code = "runas_unavailable"


class StorageUnavailable(ServiceUnavailable):
    code = "storage_unavailable"


class SlurmUnavailable(ServiceUnavailable):
    code = "slurm_unavailable"


class CommandTimedOut(SlurmUnavailable):
    code = "slurm_timeout"

    def __init__(self, argv: Sequence[str], timeout_s: float, stderr: str = "") -> None:
        super().__init__(
            f"{argv[0]} did not answer within {timeout_s:g} s",
            argv=list(argv),
            timeout_s=timeout_s,
            stderr=stderr,
        )
        self.argv = list(argv)
        self.stderr = stderr


class SubmissionUncertain(SlurmUnavailable):
    """sbatch failed after its request may have reached slurmctld: the job may exist. Look for its tag."""

    code = "slurm_submission_uncertain"


class CommandFailed(SlurmUnavailable):
    code = "slurm_command_failed"

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        detail = stderr.strip() or f"exit status {returncode}"
        super().__init__(
            f"{argv[0]} failed: {detail}", argv=list(argv), returncode=returncode, stderr=stderr
        )
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


class CommandNotFound(CommandFailed):
    code = "slurm_command_missing"
