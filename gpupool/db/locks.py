"""One process at a time across every host that shares the database: PostgreSQL advisory locks.

Each key is a 64-bit number of gpupool's own, listed here so that no two uses share one.

The timers that must run once per cluster take their key with ``alone`` and, when
another host's pass holds it, say so and exit 0: every API host may run every timer
(docs/operator-guide.md, "Several hosts"). The webhook sender and the email outbox
need no key: each claims its rows (``FOR UPDATE SKIP LOCKED`` and a lease), so two
of them never deliver one row twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

# `gpupool idle check`: one pass at a time (gpupool.gpu_usage.idle). The bytes spell "gp-idle".
IDLE_CHECK = 0x67_70_2D_69_64_6C_65
# `gpupool billing run` (the billing timer): the pass, the budgets pushed to Slurm, the output
# retention and the cancels of exhausted accounts, once per cluster. The pass alone would be
# safe (its billing_state row lock makes a second wait, then add nothing), the rest would be done
# twice. The bytes spell "gp-bill".
BILLING_RUN = 0x67_70_2D_62_69_6C_6C
# `gpupool sessions sweep`: one sweep of idle sessions at a time. The bytes spell "gp-swee".
SESSIONS_SWEEP = 0x67_70_2D_73_77_65_65
# One account's budget check at a time (billing.budgets.lock_budget): the first key of the
# two-key form, whose key space PostgreSQL keeps apart from the 64-bit keys above; the
# second is hashtext(account). The bytes spell "gpbu".
BUDGET_CHECK = 0x67_70_62_75


@contextmanager
def alone(session: Session, key: int) -> Iterator[bool]:
    """True while this process holds ``key`` for the block; False at once when another process holds it.

    A session-level lock on a connection of its own, not ``pg_try_advisory_xact_lock``:
    the block may commit as often as it needs to and still holds the lock, and
    PostgreSQL lets go of it when that connection closes, so a process killed
    mid-block blocks nobody. SQLite has no such lock and serves one host: the
    block always runs (True), and two blocks at once on that host are not kept apart.
    """
    bind = session.get_bind()
    if bind.dialect.name != "postgresql":
        yield True
        return
    # A session bound to one connection (the tests' rolled-back transaction) shares it: the lock is
    # the connection's all the same, and its transaction is the caller's, never committed here.
    own = isinstance(bind, Engine)
    connection = bind.connect() if isinstance(bind, Engine) else bind
    try:
        held = bool(connection.scalar(select(func.pg_try_advisory_lock(key))))
        if own:
            connection.commit()  # idle while the block runs, not idle in a transaction
        try:
            yield held
        finally:
            if held:
                connection.scalar(select(func.pg_advisory_unlock(key)))
                if own:
                    connection.commit()
    finally:
        if own:
            connection.close()
