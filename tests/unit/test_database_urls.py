"""Database URLs: libpq's host list as SQLAlchemy reads it, and what psycopg2 hands libpq."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from gpupool import db
from gpupool.config import load_settings
from gpupool.errors import ConfigError


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://gp@db1:5432,db2:5433/gpupool?target_session_attrs=read-write",
         "postgresql+psycopg2://gp@/gpupool?host=db1:5432&host=db2:5433&target_session_attrs=read-write"),
        ("postgres://gp:s%40cret@db1,db2/gpupool",
         "postgresql+psycopg2://gp:s%40cret@/gpupool?host=db1&host=db2"),
        ("postgresql://gp@db1:5432/gpupool", "postgresql+psycopg2://gp@db1:5432/gpupool"),
        ("sqlite:////var/lib/gpupool/gpupool.db", "sqlite:////var/lib/gpupool/gpupool.db"),
    ],
)
def test_a_host_list_becomes_sqlalchemys_host_parameters(given: str, expected: str) -> None:
    assert db.normalize_url(given) == expected


def test_libpq_gets_every_host_and_port_in_order() -> None:
    engine = db.make_engine("postgresql://gp@db1:5432,db2:5433,db3:5432/gpupool?target_session_attrs=read-write")
    try:
        _args, params = engine.dialect.create_connect_args(make_url(engine.url))
    finally:
        engine.dispose()
    assert params["host"] == "db1,db2,db3"
    assert params["port"] == "5432,5433,5432"
    assert params["target_session_attrs"] == "read-write"
    assert params["dbname"] == "gpupool"


def test_patroni_urls_are_read_as_a_list_and_checked() -> None:
    settings = load_settings(environ={"GPUPOOL_PATRONI_URLS": "http://db1:8008, http://db2:8008"})
    assert settings.patroni_urls == ("http://db1:8008", "http://db2:8008")
    with pytest.raises(ConfigError, match="patroni_urls"):
        load_settings(environ={"GPUPOOL_PATRONI_URLS": "db1:8008"})
