"""The Alembic migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from subscriptions.db import SchemaError, engine_for, migrate
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
