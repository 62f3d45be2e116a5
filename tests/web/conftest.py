"""The API is tested on both databases Tocsin supports: SQLite (the default) and PostgreSQL.

PostgreSQL is the server at ``TOCSIN_TEST_POSTGRES_URL`` (default: the local one,
trust auth); each test gets a database of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from infra.settings import Settings

POSTGRES_ADMIN = os.environ.get("TOCSIN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, settings: Settings) -> Iterator[Settings]:
    if request.param == "sqlite":
        yield settings
        return
    name = f"tocsin_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    yield settings.model_copy(update={"database_url": f"{base}/{name}"})
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
