"""The API is tested on both databases Tocsin supports: SQLite (the default) and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.settings import Settings
from tests.databases import migrated_postgres_template, postgres_database


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    with migrated_postgres_template() as name:
        yield name


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, settings: Settings) -> Iterator[Settings]:
    if request.param == "sqlite":
        yield settings
        return
    with postgres_database(template=request.getfixturevalue("postgres_template")) as url:
        yield settings.model_copy(update={"database_url": url})
