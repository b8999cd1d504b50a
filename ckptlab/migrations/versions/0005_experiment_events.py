"""experiment events: every status change, recorded

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 19:30:00.000000

One row per status change of an experiment (after procrastinate's ``procrastinate_events``).
Experiments that exist get one event for their current status, dated by their last known
time, with reason "recorded before events existed". The allowed statuses are spelled out
(frozen history, as in 0003).
"""
import sqlalchemy as sa
from alembic import op


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

_STATUSES = ("queued", "running", "succeeded", "failed", "oom", "timed_out", "cancelled")


def upgrade() -> None:
    allowed = ", ".join(f"'{s}'" for s in _STATUSES)
    op.create_table(
        'experiment_events',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('experiment_id', sa.Integer(), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('worker_id', sa.String(length=128), nullable=True),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.CheckConstraint(f"status IN ({allowed})", name='ck_experiment_events_status'),
        sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_experiment_events_experiment_id', 'experiment_events', ['experiment_id'], unique=False)
    op.execute(
        "INSERT INTO experiment_events (experiment_id, at, status, attempt, worker_id, reason) "
        "SELECT id, COALESCE(finished_at, started_at, created_at), status, attempt, worker_id, "
        "'recorded before events existed' FROM experiments"
    )


def downgrade() -> None:
    op.drop_index('ix_experiment_events_experiment_id', table_name='experiment_events')
    op.drop_table('experiment_events')
