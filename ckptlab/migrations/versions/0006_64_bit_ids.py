"""64-bit ids on PostgreSQL

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 19:45:00.000000

Every primary key and the foreign keys that reference them become ``BIGINT`` on
PostgreSQL (``steps.id`` would overflow ``INTEGER`` at about 2.1 billion rows, and the API
promises 64-bit ids). SQLite is left alone: its ``INTEGER PRIMARY KEY`` is the 64-bit rowid
already. On PostgreSQL each ``ALTER COLUMN ... TYPE BIGINT`` rewrites its table under an
exclusive lock: run it while no worker writes (``ckptlab up`` migrates before it starts).
The sequences of ``SERIAL`` columns are ``BIGINT``-capable already (their ``AS integer``
limit is raised with them).
"""
import sqlalchemy as sa
from alembic import op


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

#: (table, column) pairs, primary keys before the foreign keys that reference them.
_COLUMNS = (
    ("sweeps", "id"),
    ("experiments", "id"),
    ("experiments", "sweep_id"),
    ("steps", "id"),
    ("steps", "experiment_id"),
    ("experiment_events", "id"),
    ("experiment_events", "experiment_id"),
)
_SEQUENCES = (("sweeps", "id"), ("experiments", "id"), ("steps", "id"), ("experiment_events", "id"))


def _alter(to: sa.types.TypeEngine, sequence_type: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in _COLUMNS:
        op.alter_column(table, column, type_=to, existing_nullable=column != "sweep_id")
    for table, column in _SEQUENCES:
        op.execute(f"ALTER SEQUENCE IF EXISTS {table}_{column}_seq AS {sequence_type}")


def upgrade() -> None:
    _alter(sa.BigInteger(), "bigint")


def downgrade() -> None:
    _alter(sa.Integer(), "integer")
