"""The API is tested on both databases Tocsin supports: SQLite (the default) and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.settings import Settings
from tests.databases import migrated_postgres_template, postgres_database


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``database_plays_no_part`` is not run on PostgreSQL: its copy there would only pay for a
    database (~0.3 s) to test again what happens before any query."""
    dropped = [item for item in items if item.get_closest_marker("database_plays_no_part")
               and getattr(getattr(item, "callspec", None), "params", {}).get("settings") == "postgresql"]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(dropped)
        items[:] = [item for item in items if item not in gone]


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
