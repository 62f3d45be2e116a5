"""subscriptions.catalog_version: the catalog version of a subscription's last change

Its page says "not evaluated yet" on a shard whose last batch evaluated an older catalog; it compared the
subscription's ``updated_at`` (the web host's clock) with when the shard read the catalog (an executor's clock),
so a skew between the hosts moved it. Rows from before stay NULL (not judged) until their next change. A nullable
column is added in place on SQLite, so the table keeps AUTOINCREMENT; dropping it (SQLite 3.35 and later, and
PostgreSQL) does not recreate the table either.

Revision ID: 0007_catalog_version
Revises: 0006_name_lengths
"""

from alembic import op
import sqlalchemy as sa


revision = '0007_catalog_version'
down_revision = '0006_name_lengths'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('subscriptions', sa.Column('catalog_version', sa.Integer(), nullable=True))


def downgrade() -> None:
    op.execute('ALTER TABLE subscriptions DROP COLUMN catalog_version')
