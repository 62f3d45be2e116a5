"""Throw-away PostgreSQL databases for tests of the PostgreSQL path.

The server is ``TOCSIN_TEST_POSTGRES_URL`` (default: the local one, trust auth).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

POSTGRES_ADMIN = os.environ.get("TOCSIN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _url(name: str) -> str:
    return f"{POSTGRES_ADMIN.rsplit('/', 1)[0].replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"


@contextmanager
def postgres_database(template: str | None = None) -> Iterator[str]:
    """The SQLAlchemy URL of a new database, dropped afterwards: empty, or a copy of the database ``template``
    (which nobody may be connected to) with a deployment id of its own."""
    name = f"tocsin_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    url = _url(name)
    if template:
        renew_deployment_id(url)
    try:
        yield url
    finally:  # FORCE closes the connections cached engines still hold
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def renew_deployment_id(url: str) -> None:
    """Give a copied database a deployment id of its own, as a new one gets (Redis keys are namespaced by it)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("update deployment set deployment_id = :id"), {"id": uuid.uuid4().hex[:12]})
    engine.dispose()


@contextmanager
def migrated_postgres_template() -> Iterator[str]:
    """The name of a database at Alembic's head to copy with ``postgres_database(template=...)``: creating and
    migrating a new one took ~0.5 s of every PostgreSQL test's setup, a copy ~0.2 s."""
    from sqlalchemy import create_engine

    from subscriptions.db import migrate

    with postgres_database() as url:
        engine = create_engine(url)
        migrate(engine)
        engine.dispose()  # a template must have no connections
        yield url.rsplit("/", 1)[1]
