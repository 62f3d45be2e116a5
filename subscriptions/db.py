"""Database engine, schema migrations and sessions (SQLite by default, PostgreSQL in production).

The schema is owned by Alembic (``subscriptions/migrations``). Every process that
opens the database brings it to the newest revision first, under a lock (a file
lock for SQLite, an advisory lock for PostgreSQL), so processes starting together
never race on DDL.

Each caller may size its engine's pool (:class:`DbPool`); the web app does, with a short
wait (``web.deps.web_sessions``), and other processes keep SQLAlchemy's defaults.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

MIGRATIONS = Path(__file__).parent / "migrations"
_PG_MIGRATION_LOCK = 7_391_027_113  # any constant: the advisory lock id of schema upgrades


class SchemaError(RuntimeError):
    """The database holds tables Alembic does not know about."""


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    tables = set(inspect(connection).get_table_names())
    if tables and "alembic_version" not in tables:
        raise SchemaError(
            f"the database at {connection.engine.url!r} predates schema migrations; move it away and start again"
        )
    command.upgrade(alembic_config(connection), "head")


@contextmanager
def _file_lock(database: str | None) -> Iterator[None]:
    """An exclusive lock beside a SQLite file (an in-memory database has one process: no lock)."""
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision, one process at a time.

    SQLite migrations that recreate a table (``batch_alter_table``) run with foreign keys off, or
    dropping the old table would cascade-delete its children; they are checked afterwards.
    """
    sqlite = engine.dialect.name == "sqlite"
    with _file_lock(engine.url.database) if sqlite else nullcontext(), engine.connect() as connection:
        if sqlite:
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")  # outside a transaction, or it is ignored
            connection.commit()
        try:
            with connection.begin():
                if not sqlite:
                    connection.execute(text("select pg_advisory_xact_lock(:id)"), {"id": _PG_MIGRATION_LOCK})
                _upgrade(connection)
                if sqlite and connection.exec_driver_sql("PRAGMA foreign_key_check").first() is not None:
                    raise SchemaError("a migration left rows pointing at missing rows")
        finally:
            if sqlite:
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                connection.commit()


@dataclass(frozen=True)
class DbPool:
    """A connection pool's size: ``size`` connections kept open, ``max_overflow`` more while all are in use, and
    how long a caller waits for one when none is free (then ``sqlalchemy.exc.TimeoutError``)."""

    size: int
    max_overflow: int
    timeout_s: float


def deployment_id(url: str) -> str:
    """The id this database was created with (see ``models.Deployment``)."""
    with engine_for(url).connect() as connection:
        return connection.execute(text("select deployment_id from deployment")).scalar_one()


@lru_cache(maxsize=8)
def engine_for(url: str, pool: DbPool | None = None) -> Engine:
    """The engine of ``url`` with a ``pool`` of that size (None: SQLAlchemy's, 5 + 10 connections, 30 s waits)."""
    sizing = {} if pool is None else {"pool_size": pool.size, "max_overflow": pool.max_overflow,
                                      "pool_timeout": pool.timeout_s}
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **sizing)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()
    else:
        engine = create_engine(url, pool_pre_ping=True, **sizing)
    migrate(engine)
    return engine


def session_factory(url: str, pool: DbPool | None = None) -> sessionmaker[Session]:
    return sessionmaker(engine_for(url, pool), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = session_factory(url)()
    try:
        yield session
        session.commit()
    except Exception:
        session.rollback()
        raise
    finally:
        session.close()
