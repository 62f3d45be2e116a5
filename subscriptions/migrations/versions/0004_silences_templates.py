"""silences (Alertmanager-style, by matcher, with a comment and expiry) and per-endpoint message templates

Revision ID: 0004_silences_templates
Revises: 0003_invitations
"""

from alembic import op
import sqlalchemy as sa


revision = '0004_silences_templates'
down_revision = '0003_invitations'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('silences',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('owner_id', sa.Integer(), nullable=False),
    sa.Column('created_by', sa.Integer(), nullable=True),
    sa.Column('comment', sa.Text(), nullable=False),
    sa.Column('matchers', sa.JSON(), nullable=False),
    sa.Column('starts_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ends_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expired_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['owner_id'], ['users.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['created_by'], ['users.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id'),
    sqlite_autoincrement=True
    )
    op.create_index(op.f('ix_silences_owner_id'), 'silences', ['owner_id'], unique=False)
    op.create_index(op.f('ix_silences_ends_at'), 'silences', ['ends_at'], unique=False)
    with op.batch_alter_table('endpoints') as batch:
        batch.add_column(sa.Column('template', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('endpoints') as batch:
        batch.drop_column('template')
    op.drop_index(op.f('ix_silences_ends_at'), table_name='silences')
    op.drop_index(op.f('ix_silences_owner_id'), table_name='silences')
    op.drop_table('silences')
