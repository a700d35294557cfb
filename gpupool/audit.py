"""The audit log: one row per action that changes what an account may do or spend.

Written by the action's own transaction (``record``), so a change and its
row commit together or not at all; nothing ever updates or removes a row
(migration 0022's triggers, for every role). Customers' actions come through
the API and the web pages (``api.audit`` fills in who and from where);
operators' through the command line (``operator_actor``). Submits are not
here: the jobs table already records each one with its owner and time.

Actions (``target`` in brackets):

- ``key.create`` [key id], ``key.revoke`` [key id]
- ``member.set`` [subject], ``member.remove`` [subject]; ``member.user`` [subject] (operators: the member's own Unix user)
- ``alerts.set`` [account]
- ``webhook.create`` [endpoint id], ``webhook.delete`` [endpoint id]
- ``job.cancel`` [job id], ``task.cancel`` [job id/index]
- ``signin``, ``signout`` [web session]
- operators: ``account.create``, ``account.set``, ``account.disable``, ``account.enable``,
  ``token.create`` [token id], ``token.revoke`` [token id], ``price.set`` [GPU type],
  ``adjustment.add``, ``idle_policy.set``, ``idle_policy.delete`` [scope name],
  ``node.drain``, ``node.resume`` [Slurm node name], ``run.credit`` [the job, as the operator named it]

``details`` holds what was asked for (scope, role, limits, thresholds, URL),
never a secret.
"""

from __future__ import annotations

import datetime as dt
import os
import pwd
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from gpupool.models.audit import AuditEvent

KEY_CREATE, KEY_REVOKE = "key.create", "key.revoke"
MEMBER_SET, MEMBER_REMOVE = "member.set", "member.remove"
MEMBER_USER = "member.user"
ALERTS_SET = "alerts.set"
WEBHOOK_CREATE, WEBHOOK_DELETE = "webhook.create", "webhook.delete"
JOB_CANCEL, TASK_CANCEL = "job.cancel", "task.cancel"
SIGNIN, SIGNOUT = "signin", "signout"
ACCOUNT_CREATE, ACCOUNT_SET = "account.create", "account.set"
ACCOUNT_DISABLE, ACCOUNT_ENABLE = "account.disable", "account.enable"
TOKEN_CREATE, TOKEN_REVOKE = "token.create", "token.revoke"
PRICE_SET, ADJUSTMENT_ADD = "price.set", "adjustment.add"
IDLE_POLICY_SET, IDLE_POLICY_DELETE = "idle_policy.set", "idle_policy.delete"
NODE_DRAIN, NODE_RESUME = "node.drain", "node.resume"
RUN_CREDIT = "run.credit"

VIA_TOKEN, VIA_KEY, VIA_PAGE, VIA_CLI = "token", "key", "page", "cli"
MAX_PAGE = 500


@dataclass(frozen=True)
class Actor:
    """Who acted: a token's or key's subject (or the operator), through what, from where."""

    subject: str
    via: str
    credential: str | None = None
    address: str | None = None


def operator_actor() -> Actor:
    """The operator at the command line: the person behind sudo when there is one, else the Unix user."""
    user = os.environ.get("SUDO_USER") or pwd.getpwuid(os.getuid()).pw_name
    return Actor(subject=f"operator:{user}", via=VIA_CLI)


def record(
    session: Session,
    actor: Actor,
    action: str,
    *,
    account: str | None,
    now: dt.datetime,
    target: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """Add the row in the caller's transaction (no RETURNING: nothing needs it back)."""
    session.execute(
        insert(AuditEvent).values(
            at=now, account=account, actor=actor.subject[:255], via=actor.via, credential=actor.credential,
            address=actor.address, action=action, target=None if target is None else target[:255], details=details,
        )
    )


def events(
    session: Session,
    *,
    account: str | None = None,
    before_id: int | None = None,
    since: dt.datetime | None = None,
    limit: int = 100,
) -> Sequence[AuditEvent]:
    """Newest first: the account's (every account's when None), older than ``before_id``, from ``since`` on."""
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(max(1, min(limit, MAX_PAGE)))
    if account is not None:
        query = query.where(AuditEvent.account == account)
    if before_id is not None:
        query = query.where(AuditEvent.id < before_id)
    if since is not None:
        query = query.where(AuditEvent.at >= since)
    return session.scalars(query).all()
