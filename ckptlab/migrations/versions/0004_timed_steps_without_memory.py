"""timed steps without memory readings

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 08:00:00.000000

Steps of the timing pass (run with the CPU tracker off) carry no memory reading: their
``allocated_bytes`` and ``peak_allocated_bytes`` are NULL (explicit, not a zero).
"""
import sqlalchemy as sa
from alembic import op


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('steps', schema=None) as batch_op:
        batch_op.alter_column('allocated_bytes', existing_type=sa.BigInteger(), nullable=True)
        batch_op.alter_column('peak_allocated_bytes', existing_type=sa.BigInteger(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM steps WHERE allocated_bytes IS NULL OR peak_allocated_bytes IS NULL")
    with op.batch_alter_table('steps', schema=None) as batch_op:
        batch_op.alter_column('allocated_bytes', existing_type=sa.BigInteger(), nullable=False)
        batch_op.alter_column('peak_allocated_bytes', existing_type=sa.BigInteger(), nullable=False)
