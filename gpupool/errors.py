"""Every error gpupool raises, in one tree.

    GpupoolError
    ├── ConfigError                 settings missing or malformed
    │   └── PriceMissing            usage of a GPU type that has no price yet
    ├── MigrationRequired           database schema is not at the code's revision
    ├── RequestError                the caller asked for something wrong
    │   ├── BadRequest              malformed body or query (400)
    │   │   └── UnknownFields       fields the schema does not define (400)
    │   ├── Unauthorized            no token, bad token (401)
    │   ├── Forbidden               valid token, not allowed (403)
    │   ├── PaymentRequired         the account's budget cannot cover the job (402)
    │   ├── NotFound                no such resource for this caller (404)
    │   ├── Conflict                state or idempotency clash (409)
    │   ├── PayloadTooLarge         body over the configured limit (413)
    │   ├── UnsupportedMediaType    body is not JSON (415)
    │   └── ValidationFailed        well-formed but invalid values (422)
    │       └── SlurmRejected       Slurm refused the job outright (422)
    └── ServiceUnavailable          a dependency is down or slow (503)
        ├── DatabaseUnavailable
        └── SlurmUnavailable
            ├── CommandTimedOut     a Slurm command ran past its timeout
            └── CommandFailed       a Slurm command exited non-zero (stderr kept)
                └── CommandNotFound the binary is not where configured

The API maps this tree to HTTP status codes in exactly one place
(``api.errors``); the CLI maps it to exit codes in ``gpupool.cli``.
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


class PayloadTooLarge(RequestError):
    code = "payload_too_large"


class UnsupportedMediaType(RequestError):
    code = "unsupported_media_type"


class ValidationFailed(RequestError):
    code = "validation_failed"


class SlurmRejected(ValidationFailed):
    code = "slurm_rejected"


class ServiceUnavailable(GpupoolError):
    code = "service_unavailable"


class DatabaseUnavailable(ServiceUnavailable):
    code = "database_unavailable"


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
