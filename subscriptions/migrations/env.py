"""Alembic environment: runs on the connection :func:`subscriptions.db.migrate` hands over.

From the command line (``alembic -c subscriptions/alembic.ini ...``) it connects to
``TOCSIN_DATABASE_URL`` itself.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from subscriptions.models import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    from core.settings import get_settings

    with create_engine(get_settings().database_url).begin() as own:
        _run(own)
