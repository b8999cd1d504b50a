"""status check constraint

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 15:50:00.000000

The allowed values are spelled out here on purpose: a migration is frozen history and must
not change when ``ckptlab.domain.Status`` does (a later status gets its own migration).
"""
from alembic import op


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

_STATUSES = ("queued", "running", "succeeded", "failed", "oom", "timed_out", "cancelled")


def upgrade() -> None:
    allowed = ", ".join(f"'{s}'" for s in _STATUSES)
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.create_check_constraint('ck_experiments_status', f"status IN ({allowed})")


def downgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_constraint('ck_experiments_status', type_='check')
