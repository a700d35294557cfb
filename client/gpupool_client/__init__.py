"""gpupool's Python client: ``Client`` (blocking), ``AsyncClient`` (asyncio), ``verify_signature`` for webhooks."""

from gpupool_client._core import TERMINAL_STATES, RetryPolicy, __version__
from gpupool_client.aio import AsyncClient, AsyncJob
from gpupool_client.client import Client, Job, Task
from gpupool_client.errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    Forbidden,
    GpupoolError,
    InvalidSignature,
    NotFound,
    PaymentRequired,
    RateLimited,
    ServiceUnavailable,
    StorageQuotaExceeded,
    Unauthorized,
    ValidationFailed,
    WaitTimeout,
)
from gpupool_client.signature import SIGNATURE_HEADER, compute_signature, verify_signature

__all__ = [
    "SIGNATURE_HEADER",
    "TERMINAL_STATES",
    "AsyncClient",
    "AsyncJob",
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Forbidden",
    "GpupoolError",
    "InvalidSignature",
    "Job",
    "NotFound",
    "PaymentRequired",
    "RateLimited",
    "RetryPolicy",
    "ServiceUnavailable",
    "StorageQuotaExceeded",
    "Task",
    "Unauthorized",
    "ValidationFailed",
    "WaitTimeout",
    "__version__",
    "compute_signature",
    "verify_signature",
]
