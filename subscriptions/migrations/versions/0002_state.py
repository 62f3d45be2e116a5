"""ids never reused (SQLite AUTOINCREMENT), the deployment id, endpoint secrets encrypted at rest

Revision ID: 0002_state
Revises: 0001
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import sqlalchemy as sa
from alembic import op

if TYPE_CHECKING:
    from core.settings import Settings

revision = "0002_state"
down_revision = "0001"
branch_labels = None
depends_on = None

# Tables whose ids leak into Redis keys, deliveries and the evaluator's state.
NEVER_REUSED = ("users", "api_tokens", "endpoints", "subscriptions")


def _settings() -> Settings:
    """The running process's settings: the key that encrypts existing secrets."""
    from core.settings import get_settings

    return get_settings()


def _foreign_keys_off(bind: sa.Connection) -> None:
    """Recreating a parent table with foreign keys on would cascade-delete its children's rows."""
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("run this migration with SQLite foreign keys off (subscriptions.db.migrate does)")


def upgrade() -> None:
    bind = op.get_bind()
    _foreign_keys_off(bind)
    deployment = op.create_table(
        "deployment",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("deployment_id", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("deployment_id"),
    )
    op.bulk_insert(deployment, [{"id": 1, "deployment_id": uuid.uuid4().hex[:12]}])

    with op.batch_alter_table("endpoints") as batch:
        batch.add_column(sa.Column("secret_encrypted", sa.String(length=512), nullable=True))
    endpoints = sa.table("endpoints", sa.column("id", sa.Integer), sa.column("secret", sa.String),
                         sa.column("secret_encrypted", sa.String))
    rows = bind.execute(sa.select(endpoints.c.id, endpoints.c.secret).where(endpoints.c.secret.is_not(None))).all()
    if rows:
        from subscriptions.vault import seal

        settings = _settings()
        for endpoint_id, secret in rows:
            bind.execute(endpoints.update().where(endpoints.c.id == endpoint_id)
                         .values(secret_encrypted=seal(settings, secret)))
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("secret")

    # Last: a later batch operation on SQLite recreates its table without AUTOINCREMENT unless it passes
    # table_kwargs={"sqlite_autoincrement": True} again (mind that in future migrations).
    if bind.dialect.name == "sqlite":  # PostgreSQL sequences never go back already
        for table in NEVER_REUSED:  # parents first; subscriptions.db.migrate turns foreign keys off meanwhile
            with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": True}):
                pass


def downgrade() -> None:
    bind = op.get_bind()
    _foreign_keys_off(bind)
    with op.batch_alter_table("endpoints") as batch:
        batch.add_column(sa.Column("secret", sa.String(length=128), nullable=True))
    endpoints = sa.table("endpoints", sa.column("id", sa.Integer), sa.column("secret", sa.String),
                         sa.column("secret_encrypted", sa.String))
    rows = bind.execute(sa.select(endpoints.c.id, endpoints.c.secret_encrypted)
                        .where(endpoints.c.secret_encrypted.is_not(None))).all()
    if rows:
        from subscriptions.vault import reveal

        settings = _settings()
        for endpoint_id, token in rows:
            bind.execute(endpoints.update().where(endpoints.c.id == endpoint_id).values(secret=reveal(settings, token)))
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("secret_encrypted")
    op.drop_table("deployment")
    if bind.dialect.name == "sqlite":
        for table in NEVER_REUSED:
            with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": False}):
                pass
