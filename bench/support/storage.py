"""Account storage for tests and benches: a storage root tenants can reach, real volumes, and the helper that serves it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from sqlalchemy import update

from bench.support.tenancy import root_for_tests, runas_helper
from gpupool import db
from gpupool.config import Settings
from gpupool.models import Account
from gpupool.slurm.tenants import lookup_tenant
from gpupool.storage.volumes import ensure_volume, remove_volume


def storage_root_for_tests() -> AbstractContextManager[Path]:
    return root_for_tests("gpupool-data-")


@contextmanager
def account_volumes(settings: Settings, database_url: str, accounts: Sequence[str], quota_bytes: int) -> Iterator[None]:
    """Each account's volume of ``quota_bytes``, recorded as its quota, as `account create --storage-quota` makes it."""
    engine = db.make_engine(database_url)
    with db.make_session_factory(engine)() as session, session.begin():
        session.execute(update(Account).where(Account.name.in_(list(accounts))).values(storage_quota_bytes=quota_bytes))
    engine.dispose()
    made = []
    try:
        for account in accounts:
            assert ensure_volume(settings, lookup_tenant(settings, account), quota_bytes) == "created"
            made.append(account)
        yield
    finally:
        for account in made:
            remove_volume(settings, account)


@contextmanager
def storage_helper(job_root: Path, storage_root: Path, log_dir: Path) -> Iterator[str]:
    """A run-as helper that knows the storage root; its socket."""
    with runas_helper(job_root, log_dir, {"GPUPOOL_STORAGE_ROOT": str(storage_root)}) as socket_path:
        yield socket_path
