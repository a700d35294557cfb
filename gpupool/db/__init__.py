"""Engine, sessions and the schema-revision check.

The API opens one session per request; the worker and the state refresher
open their own and own their transactions. Tests may hand in a session
factory bound to a connection inside an outer transaction.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import DateTime, Engine, Float, create_engine, event, literal, text
from sqlalchemy.engine import Connection, Dialect, ExceptionContext
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeDecorator

from gpupool.clock import system_clock
from gpupool.errors import DatabaseUnavailable, MigrationRequired

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes on every backend (SQLite keeps no zone of its own)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class database_now(FunctionElement[dt.datetime]):  # noqa: N801  (a SQL function, named like func.now)
    """The database server's clock, ``offset_s`` seconds on: one clock for every host that shares the database.

    PostgreSQL's ``clock_timestamp()``, not ``now()``: a statement that waited on a
    row lock compares against the moment it reads the row, not the moment its
    transaction began. SQLite's text is the form SQLAlchemy stores, so the two compare.
    """

    type = UTCDateTime()
    inherit_cache = True

    def __init__(self, offset_s: float = 0.0) -> None:
        super().__init__(literal(offset_s, Float()))


@compiles(database_now, "postgresql")
def _database_now_postgresql(element: database_now, compiler: SQLCompiler, **kw: Any) -> str:
    return f"(clock_timestamp() + {compiler.process(element.clauses, **kw)} * interval '1 second')"


@compiles(database_now, "sqlite")
def _database_now_sqlite(element: database_now, compiler: SQLCompiler, **kw: Any) -> str:
    return f"strftime('%Y-%m-%d %H:%M:%f', 'now', {compiler.process(element.clauses, **kw)} || ' seconds')"


class Base(DeclarativeBase):
    pass


# What recorded times (created_at columns, leases) read: the real time, from the one clock
# module; decisions by the calendar read Settings.calendar_clock() instead.
utcnow = system_clock


def normalize_url(url: str) -> str:
    """Plain ``postgresql://`` URLs mean psycopg2, the driver gpupool ships with.

    libpq's multi-host form, ``postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write``
    (the database hosts of a Patroni cluster, libpq connecting to whichever takes writes), is
    rewritten to SQLAlchemy's spelling of the same, ``postgresql+psycopg2://u@/db?host=h1:5432&host=h2:5432&...``:
    SQLAlchemy's URL parser reads one port per URL, and ``h1:5432,h2:5432`` is not one.
    psycopg2 hands both hosts to libpq as ``host=h1,h2 port=5432,5432``.
    """
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            url = "postgresql+psycopg2://" + url[len(prefix):]
    if url.startswith("postgresql"):
        return _hosts_as_query(url)
    return url


def _hosts_as_query(url: str) -> str:
    """``scheme://user@h1:p1,h2:p2/db?q`` as ``scheme://user@/db?host=h1:p1&host=h2:p2&q``; any other URL as it is."""
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if "," not in hostlist:
        return url
    hosts = [host for host in hostlist.split(",") if host]
    query = urlencode([("host", host) for host in hosts], safe=":[]") + ("&" + parts.query if parts.query else "")
    return urlunsplit((parts.scheme, userinfo + at, parts.path, query, parts.fragment))


def make_engine(url: str, *, pre_ping: bool = False, **kwargs: Any) -> Engine:
    url = normalize_url(url)
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if path and path != url and not path.startswith(":memory:"):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            # WAL lets readers proceed while the refresher writes.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    # Pre-ping (``pre_ping``, the setting database_pre_ping) costs a round trip per request: off
    # by default. Without it a connection that died with the server (a failover) fails one
    # request, which answers 503, and SQLAlchemy then empties the pool: the next request
    # connects afresh, through libpq's host list, to whichever host leads now.
    # connect_timeout is libpq's, per host of a host list.
    kwargs.setdefault("connect_args", {"connect_timeout": 5})
    kwargs.setdefault("pool_pre_ping", pre_ping)
    if url.startswith("postgresql+psycopg2"):
        # An UPDATE of many rows (the refresher's first pass over a 10,000-job queue)
        # goes 100 statements a round trip through execute_batch, not one each.
        kwargs.setdefault("executemany_mode", "values_plus_batch")
    engine = create_engine(url, **kwargs)
    event.listen(engine, "handle_error", _server_gone_or_read_only)
    return engine


# SQLSTATEs after which a connection is worth nothing: the server shut down or is
# starting (a Patroni switchover or restart: 57P01 admin_shutdown, 57P02 crash_shutdown,
# 57P03 cannot_connect_now), or it no longer takes writes (25006 read_only_sql_transaction:
# a demoted leader, a standby behind a stale address). libpq does not call the last a
# disconnect; without this the pool would keep handing out connections to a host that
# refuses every write.
FAILOVER_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})


def _server_gone_or_read_only(context: ExceptionContext) -> None:
    """Mark the failover errors as disconnects, so SQLAlchemy empties the pool (SQLAlchemy's documented hook)."""
    if getattr(context.original_exception, "pgcode", None) in FAILOVER_SQLSTATES:
        context.is_disconnect = True


def is_failover_error(error: BaseException) -> bool:
    """True for an error the database's absence or a failover explains: the caller should retry, not report a bug."""
    if isinstance(error, DBAPIError) and (error.connection_invalidated or isinstance(error, OperationalError)):
        return True
    return getattr(getattr(error, "orig", None), "pgcode", None) in FAILOVER_SQLSTATES


def read_only_reason(session: Session) -> str | None:
    """Why this connection's database takes no writes (a standby, a demoted leader), or None when it does.

    ``transaction_read_only`` is on in a hot standby's every transaction and wherever
    ``default_transaction_read_only`` is: one round trip says both. SQLite always takes writes.
    """
    if session.get_bind().dialect.name != "postgresql":
        session.execute(text("SELECT 1"))
        return None
    row = session.execute(text("SELECT current_setting('transaction_read_only'), pg_is_in_recovery()")).one()
    if row[1]:
        return "a standby (in recovery)"
    if row[0] == "on":
        return "read-only"
    return None


def make_session_factory(bind: Engine | Connection, **kwargs: Any) -> sessionmaker:
    return sessionmaker(bind=bind, expire_on_commit=False, **kwargs)


def alembic_config(connection: Connection | None = None, url: str | None = None) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(bind: Engine | Connection) -> str | None:
    def read(conn: Connection) -> str | None:
        return MigrationContext.configure(conn).get_current_revision()

    if isinstance(bind, Connection):
        return read(bind)
    with bind.connect() as conn:
        return read(conn)


def upgrade(bind: Engine | Connection, revision: str = "head") -> None:
    if isinstance(bind, Connection):
        command.upgrade(alembic_config(connection=bind), revision)
        return
    with bind.begin() as conn:
        command.upgrade(alembic_config(connection=conn), revision)


def ensure_migrated(engine: Engine) -> None:
    """Refuse to serve a database whose schema is not at this code's revision."""
    try:
        current = current_revision(engine)
    except OperationalError as exc:
        raise DatabaseUnavailable(f"cannot reach the database: {exc.orig}") from exc
    head = head_revision()
    if current != head:
        raise MigrationRequired(
            f"the database is at schema revision {current or 'none (empty)'}, but this "
            f"gpupool needs {head}; run `gpupool db upgrade` first"
        )


def migrated_engine(url: str) -> Engine:
    """An engine on ``url``'s database, once its schema is at this code's revision (the commands' way in)."""
    engine = make_engine(url)
    ensure_migrated(engine)
    return engine


def migrated_sessions(url: str) -> sessionmaker:
    """Sessions on ``url``'s database, once its schema is at this code's revision."""
    return make_session_factory(migrated_engine(url))
