"""token names as long as the API allows: api_tokens.name and publisher_tokens.name VARCHAR(100) -> 200

The schema (``core.text.Name``) allows 200 characters; PostgreSQL refused 101-200 with a 500
(SQLite does not enforce VARCHAR lengths). On SQLite the tables are recreated (batch), keeping
AUTOINCREMENT and its high-water mark, so a deleted token's id is still never handed out again.

Revision ID: 0006_name_lengths
Revises: 0005_streams
"""

from alembic import op
import sqlalchemy as sa


revision = '0006_name_lengths'
down_revision = '0005_streams'
branch_labels = None
depends_on = None

TABLES = ('api_tokens', 'publisher_tokens')


def _name_length(table: str, old: int, new: int) -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == 'sqlite'
    sequence = sa.text('select seq from sqlite_sequence where name = :t')
    high = bind.execute(sequence, {'t': table}).scalar() if sqlite else None
    with op.batch_alter_table(table, table_kwargs={'sqlite_autoincrement': True}) as batch:
        batch.alter_column('name', existing_type=sa.String(length=old), type_=sa.String(length=new),
                           existing_nullable=False)
    if high is not None:  # the copy set it to the highest id left, which forgets deleted ones above it
        bind.execute(sa.text('update sqlite_sequence set seq = max(seq, :s) where name = :t'), {'s': high, 't': table})
        bind.execute(sa.text('insert into sqlite_sequence (name, seq) select :t, :s where not exists '
                             '(select 1 from sqlite_sequence where name = :t)'), {'s': high, 't': table})


def upgrade() -> None:
    for table in TABLES:
        _name_length(table, 100, 200)


def downgrade() -> None:
    for table in TABLES:
        _name_length(table, 200, 100)
