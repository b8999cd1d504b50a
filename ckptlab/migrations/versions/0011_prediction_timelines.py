"""prediction timelines: a prediction's first and peak steps on fake tensors (issue 34)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 10:00:00.000000

One row per prediction and step whose memory timeline its fake memory pass recorded, with
memory_timelines' columns (the compressed blob and the figures a listing reads without it).
Predictions stored before have none (the API says so: 404). Nothing existing changes; going
down drops the table and the timelines with it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "prediction_timelines",
        sa.Column("prediction_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("is_peak", sa.Boolean(), nullable=False),
        sa.Column("n_events", sa.Integer(), nullable=False),
        sa.Column("baseline_bytes", sa.BigInteger(), nullable=False),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=False),
        sa.Column("peak_index", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["prediction_id"], ["predictions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("prediction_id", "step"),
    )


def downgrade() -> None:
    op.drop_table("prediction_timelines")
