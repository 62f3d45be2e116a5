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


@contextmanager
def postgres_database() -> Iterator[str]:
    """The SQLAlchemy URL of a new, empty database, dropped afterwards."""
    name = f"tocsin_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    url = f"{base}/{name}"
    try:
        yield url
    finally:  # FORCE closes the connections cached engines still hold
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
