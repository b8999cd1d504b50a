"""step rollups: a multi-resolution summary of each attempt's steps

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 10:00:00.000000

One row per (experiment, attempt, level, bucket of 2**level steps) with the bucket's step
rows (count, first and last step) and, for each series metric, the count of finite values,
min and max with their steps, and the values at the first and last step (see
ckptlab/db/rollups.py). The metrics and stats are spelled out (frozen history).

The attempts that have steps are rolled up here, with ckptlab.db.rollups.rebuild_rollups
(the code the step writer uses) when that code's table is this revision's
(``ROLLUP_REVISION == "0007"``); a later migration that changes the table's columns names
itself there and rebuilds, so an old database upgraded past it is filled once, by it. The
fill reads every step once: a few seconds per million steps on a 2-core VM.
"""
import sqlalchemy as sa
from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_METRICS = (
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "step_ms",
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
    "loss",
)
_STATS = ("count", "min", "min_step", "max", "max_step", "first", "last")


def _metric_columns() -> list[sa.Column]:
    cols = []
    for metric in _METRICS:
        for stat in _STATS:
            if stat == "count":
                cols.append(sa.Column(f"{metric}_{stat}", sa.Integer(), nullable=False))
            elif stat.endswith("_step"):
                cols.append(sa.Column(f"{metric}_{stat}", sa.Integer(), nullable=True))
            else:
                cols.append(sa.Column(f"{metric}_{stat}", sa.Float(), nullable=True))
    return cols


def upgrade() -> None:
    op.create_table(
        'step_rollups',
        sa.Column('experiment_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('level', sa.Integer(), nullable=False),
        sa.Column('bucket', sa.Integer(), nullable=False),
        sa.Column('n_steps', sa.Integer(), nullable=False),
        sa.Column('first_step', sa.Integer(), nullable=False),
        sa.Column('last_step', sa.Integer(), nullable=False),
        *_metric_columns(),
        sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('experiment_id', 'attempt', 'level', 'bucket'),
    )
    from sqlalchemy.orm import Session

    from ckptlab.db import rollups

    if rollups.ROLLUP_REVISION == revision:
        with Session(bind=op.get_bind()) as session:
            rollups.rebuild_rollups(session)


def downgrade() -> None:
    op.drop_table('step_rollups')
