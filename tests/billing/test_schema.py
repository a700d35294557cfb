"""The migrations build exactly the schema the models declare, on both backends."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gpupool.models import Base
from tests.billing.conftest import LedgerDb


def test_migrated_schema_matches_the_models(ledger_db: LedgerDb) -> None:
    with ledger_db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": False})
        differences = compare_metadata(context, Base.metadata)
    assert differences == []
