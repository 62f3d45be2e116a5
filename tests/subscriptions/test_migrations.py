"""The Alembic migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, text

from subscriptions.db import SchemaError, alembic_config, engine_for, migrate
from subscriptions.models import Base
from tests.databases import postgres_database


def _differences(url: str) -> list:
    with engine_for(url).connect() as connection:
        return compare_metadata(MigrationContext.configure(connection), Base.metadata)


def test_sqlite_schema_matches_the_models(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert _differences(url) == []
    migrate(engine_for(url))  # a second run is a no-op


def test_postgresql_schema_matches_the_models() -> None:
    with postgres_database() as url:
        assert _differences(url) == []


def test_a_database_from_before_migrations_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with create_engine(url).begin() as connection:
        connection.execute(text("create table subscriptions (id integer primary key)"))
    with pytest.raises(SchemaError, match="predates schema migrations"):
        engine_for(url)


@contextmanager
def _database_at(database: str, tmp_path: Path, revision: str) -> Iterator[tuple[str, Engine]]:
    """A new ``database`` (sqlite, postgresql) migrated up to ``revision``, with one user (id 1)."""
    with (nullcontext(f"sqlite:///{tmp_path / 'old.db'}") if database == "sqlite" else postgres_database()) as url:
        engine = create_engine(url)
        with engine.begin() as connection:
            command.upgrade(alembic_config(connection), revision)
            connection.execute(text("insert into users (id, email, password_hash, role, created_at) "
                                    "values (1, 'a@example.com', 'x', 'user', current_timestamp)"))
        yield url, engine


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_token_names_widen_to_200_keeping_rows_and_never_reusing_ids(database: str, tmp_path: Path) -> None:
    """0006 widens the token names (PostgreSQL refused 101-200 characters with a 500); on SQLite it
    recreates the tables, which must keep their rows, links and AUTOINCREMENT high-water mark."""
    with _database_at(database, tmp_path, "0005_streams") as (url, engine):
        with engine.begin() as connection:
            connection.execute(text("insert into streams (id, name, topic, schema, version, created_at, updated_at) "
                                    "values (1, 's', 't', '{}', 1, current_timestamp, current_timestamp)"))
            for n in (1, 2, 3):
                connection.execute(text("insert into api_tokens (user_id, name, token_hash, prefix, created_at) "
                                        f"values (1, 'api{n}', 'h{n}', 'p', current_timestamp)"))
                connection.execute(text("insert into publisher_tokens (name, token_hash, prefix, created_at) "
                                        f"values ('pub{n}', 'h{n}', 'p', current_timestamp)"))
            connection.execute(text("insert into publisher_token_streams values (1, 1)"))
            connection.execute(text("delete from api_tokens where id = 3"))
            connection.execute(text("delete from publisher_tokens where id = 3"))
        engine.dispose()
        migrate(engine_for(url))
        assert _differences(url) == []
        with engine_for(url).begin() as connection:
            assert connection.execute(text("select name from api_tokens order by id")).scalars().all() == ["api1", "api2"]
            assert connection.execute(text("select * from publisher_token_streams")).all() == [(1, 1)]
            for table in ("api_tokens", "publisher_tokens"):
                user = "user_id, " if table == "api_tokens" else ""
                new_id = connection.execute(text(f"insert into {table} ({user}name, token_hash, prefix, created_at) "
                                                 f"values ({'1, ' if user else ''}:name, 'h9', 'p', current_timestamp) "
                                                 "returning id"), {"name": "n" * 200}).scalar_one()
                assert new_id == 4, (table, new_id)  # 3 was deleted before the upgrade: never handed out again


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_catalog_version_is_added_empty_and_dropped_keeping_rows_and_never_reusing_ids(database: str,
                                                                                      tmp_path: Path) -> None:
    """0007 adds ``subscriptions.catalog_version`` (NULL on rows from before: not judged) in place, and its downgrade
    drops it the same way: on SQLite neither recreates the table, which would forget AUTOINCREMENT's high-water mark."""
    with _database_at(database, tmp_path, "0006_name_lengths") as (url, engine):
        with engine.begin() as connection:
            for n in (1, 2):
                connection.execute(text("insert into subscriptions (owner_id, name, condition, condition_spec, active, "
                                        f"policy, created_at, updated_at) values (1, 's{n}', 'c', '{{}}', true, "
                                        "'{}', current_timestamp, current_timestamp)"))
            connection.execute(text("delete from subscriptions where id = 2"))
        engine.dispose()
        migrate(engine_for(url))
        assert _differences(url) == []
        with engine_for(url).begin() as connection:
            assert connection.execute(text("select id, catalog_version from subscriptions")).all() == [(1, None)]
            command.downgrade(alembic_config(connection), "0006_name_lengths")
            assert connection.execute(text("select id, name from subscriptions")).all() == [(1, "s1")]
            new_id = connection.execute(text(
                "insert into subscriptions (owner_id, name, condition, condition_spec, active, policy, created_at, "
                "updated_at) values (1, 's3', 'c', '{}', true, '{}', current_timestamp, current_timestamp) "
                "returning id")).scalar_one()
            assert new_id == 3  # 2 was deleted: never handed out again
