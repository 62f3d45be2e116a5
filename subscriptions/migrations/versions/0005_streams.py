"""streams (declared schemas mapped onto Kafka topics) and publisher tokens scoped to streams

The built-in ``trades`` stream is declared by ``subscriptions.streams.StreamService.ensure_builtin`` at
start-up, not here: its topic and partitions come from the settings of the process, which a migration
does not see.

Revision ID: 0005_streams
Revises: 0004_silences_templates
"""

from alembic import op
import sqlalchemy as sa


revision = '0005_streams'
down_revision = '0004_silences_templates'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('streams',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('topic', sa.String(length=255), nullable=False),
    sa.Column('schema', sa.JSON(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name'),
    sqlite_autoincrement=True
    )
    op.create_table('publisher_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('created_by', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['created_by'], ['users.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash'),
    sqlite_autoincrement=True
    )
    op.create_table('publisher_token_streams',
    sa.Column('token_id', sa.Integer(), nullable=False),
    sa.Column('stream_id', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['token_id'], ['publisher_tokens.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['stream_id'], ['streams.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('token_id', 'stream_id')
    )


def downgrade() -> None:
    op.drop_table('publisher_token_streams')
    op.drop_table('publisher_tokens')
    op.drop_table('streams')
