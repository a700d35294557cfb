"""The timers every API host runs, done once per cluster: a pass that finds its lock held by another host's says so, exits 0, does nothing.

"Another host" is a connection of the test's own holding the timer's advisory lock, as
a pass on another host holds it for as long as it runs. Slurm's commands are pointed
at a folder without them: a pass that went on would fail on its first call.
And any command whose database turns out read-only (a standby) says so and exits 1.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import func, select

from gpupool.db.locks import BILLING_RUN, IDLE_CHECK, SESSIONS_SWEEP
from gpupool.models import BillingPass
from tests.billing.conftest import LedgerDb, _prepare
from tests.conftest import create_database, drop_database


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerDb]:
    name = f"gpupool_once_{secrets.token_hex(4)}"
    prepared = _prepare(create_database(name), tmp_path_factory.mktemp("archive"))
    yield prepared
    prepared.engine.dispose()
    drop_database(name)


@pytest.mark.parametrize(
    ("command", "key", "says"),
    [
        (("billing", "run"), BILLING_RUN, "another billing run holds the lock (this host or another): this one did nothing"),
        (("sessions", "sweep"), SESSIONS_SWEEP, "another sweep holds the lock (this host or another): this one did nothing"),
        (("idle", "check"), IDLE_CHECK, "another idle check pass is running (it holds the lock): this one did nothing"),
    ],
    ids=["billing", "sessions-sweep", "idle-check"],
)
def test_a_timer_whose_lock_another_host_holds_does_nothing_and_exits_0(
    ledger: LedgerDb, tmp_path: Path, command: tuple[str, ...], key: int, says: str
) -> None:
    no_slurm = str(tmp_path)  # empty: any Slurm command the pass ran would fail it
    with ledger.engine.connect() as other_host:
        assert other_host.scalar(select(func.pg_try_advisory_lock(key))) is True
        held = ledger.cli(*command, GPUPOOL_SLURM_BIN_DIR=no_slurm)
        other_host.scalar(select(func.pg_advisory_unlock(key)))
    assert (held.returncode, held.stdout.strip()) == (0, says), held.stderr
    assert no_slurm not in held.stderr  # it never reached for Slurm
    with ledger.engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(BillingPass)) == 0
    assert ledger.mark() is None
    # The lock free again, the same command goes on to its pass: to Slurm's commands, missing here.
    alone = ledger.cli(*command, GPUPOOL_SLURM_BIN_DIR=no_slurm)
    assert says not in alone.stdout
    assert f"{no_slurm}/" in alone.stderr, (alone.stdout, alone.stderr)


def test_a_command_on_a_read_only_database_says_so_and_exits_1(ledger: LedgerDb) -> None:
    """A standby (PostgreSQL's own default_transaction_read_only here) refuses the write: a message, not a traceback."""
    read_only = ledger.url + "?options=" + quote("-c default_transaction_read_only=on")
    result = ledger.cli("price", "set", "rtx4090", "0.0002", "--from", "2020-02-01", GPUPOOL_DATABASE_URL=read_only)
    assert result.returncode == 1
    assert result.stderr.startswith("gpupool: error: the database is not answering or not taking writes (cannot execute"), result.stderr
    assert "Traceback" not in result.stderr
