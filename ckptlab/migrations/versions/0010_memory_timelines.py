"""memory timelines: a run's first and peak steps, every allocation and free (issue 34)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 09:00:00.000000

One row per experiment, attempt and step whose memory timeline the worker recorded: the
compressed blob (``data``, ckptlab.analysis.timeline's format) and the figures a listing
reads without it. Runs stored before have none (the API says so: 404). Nothing existing
changes; going down drops the table and the timelines with it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memory_timelines",
        sa.Column("experiment_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("is_peak", sa.Boolean(), nullable=False),
        sa.Column("n_events", sa.Integer(), nullable=False),
        sa.Column("baseline_bytes", sa.BigInteger(), nullable=False),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=False),
        sa.Column("peak_index", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("experiment_id", "attempt", "step"),
    )


def downgrade() -> None:
    op.drop_table("memory_timelines")
