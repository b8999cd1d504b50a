"""predictions: "will it fit?" predictions of a spec for a target device

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 20:00:00.000000

One row per prediction, stored once it has an outcome: the spec (JSON), the target's name,
the capacity it was judged against when given, the status (succeeded, failed or timed_out:
spelled out here, frozen history as in 0003), the predicted summary (JSON), the error, the
times and the model kind and strategy (for filters). Nothing existing changes.
"""
import sqlalchemy as sa
from alembic import op


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

_STATUSES = ("succeeded", "failed", "timed_out")


def upgrade() -> None:
    allowed = ", ".join(f"'{s}'" for s in _STATUSES)
    op.create_table(
        'predictions',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('spec', sa.JSON(), nullable=False),
        sa.Column('target', sa.String(length=64), nullable=False),
        sa.Column('capacity_bytes', sa.BigInteger(), nullable=True),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('summary', sa.JSON(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('elapsed_s', sa.Float(), nullable=True),
        sa.Column('model_kind', sa.String(length=32), nullable=False),
        sa.Column('strategy', sa.String(length=32), nullable=False),
        sa.CheckConstraint(f"status IN ({allowed})", name='ck_predictions_status'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_predictions_target', 'predictions', ['target'], unique=False)
    op.create_index('ix_predictions_status', 'predictions', ['status'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_predictions_status', table_name='predictions')
    op.drop_index('ix_predictions_target', table_name='predictions')
    op.drop_table('predictions')
