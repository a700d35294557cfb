"""Typed ORM models, split by area."""

from gpupool.db import Base
from gpupool.models.accounts import ACCOUNT_NAME, Account
from gpupool.models.alerts import AlertSent, AlertSettings, EmailOutbox
from gpupool.models.api_keys import ApiKey
from gpupool.models.audit import AuditEvent
from gpupool.models.billing import (
    AccountSpend,
    Adjustment,
    BillingPass,
    BillingState,
    LedgerEntry,
    MemberSpend,
    Price,
    StorageCharge,
    StoragePrice,
    StorageSample,
)
from gpupool.models.gpu_usage import GpuSample, IdleGpuHour, IdlePolicy
from gpupool.models.jobs import TERMINAL_STATES, Job, JobTask, SlurmSync
from gpupool.models.members import MEMBER_ROLES, AccountMember, MemberIdentity
from gpupool.models.report import NodeCost, NodeHealthEvent
from gpupool.models.sessions import JobSession, SessionGrant
from gpupool.models.tokens import IssuedToken
from gpupool.models.web_sessions import WebSession
from gpupool.models.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent

__all__ = [
    "ACCOUNT_NAME",
    "TERMINAL_STATES",
    "Account",
    "AccountMember",
    "AccountSpend",
    "MEMBER_ROLES",
    "AlertSent",
    "AlertSettings",
    "AuditEvent",
    "EmailOutbox",
    "Adjustment",
    "Base",
    "BillingPass",
    "BillingState",
    "GpuSample",
    "IdleGpuHour",
    "IdlePolicy",
    "IssuedToken",
    "ApiKey",
    "Job",
    "JobTask",
    "JobSession",
    "LedgerEntry",
    "MemberIdentity",
    "MemberSpend",
    "NodeCost",
    "NodeHealthEvent",
    "Price",
    "StorageCharge",
    "StoragePrice",
    "StorageSample",
    "SessionGrant",
    "SlurmSync",
    "WebSession",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookEvent",
]
