"""experiment log: a failed run's traceback apart from its public error

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 09:00:00.000000

``experiments.log`` (text, nullable) holds the traceback of a failed run; ``error`` keeps
one sentence. Rows stored before carried the traceback's last frames in ``error``
(``Type: message``, a blank line, then ``File "...", line N`` frames): their ``error`` is
cut to its first line and the whole text moves to ``log``. Going down drops the column and
the tracebacks with it (``error`` keeps its first line).
"""
import sqlalchemy as sa
from alembic import op


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

#: Longest first line kept as the public error, characters (as the events' reasons).
_FIRST_LINE = 500


def upgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('log', sa.Text(), nullable=True))
    experiments = sa.table('experiments', sa.column('id', sa.Integer()), sa.column('error', sa.Text()),
                           sa.column('log', sa.Text()))
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(experiments.c.id, experiments.c.error).where(experiments.c.error.like('%File "%'))
    ).all()
    for row_id, error in rows:
        lines = error.strip().splitlines()
        first = lines[0][:_FIRST_LINE] if lines else None
        conn.execute(experiments.update().where(experiments.c.id == row_id).values(error=first, log=error))


def downgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_column('log')
