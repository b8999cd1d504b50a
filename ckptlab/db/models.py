"""The database schema, defined once and imported by the backend and the worker.

Tables (after MLflow's metric storage: one row per experiment, attempt and step):

- ``experiments``: the spec (JSON), lifecycle ``status`` (see :data:`STATUSES`), timestamps
  (UTC), the worker that holds it, the summary (JSON) and the error text.
- ``steps``: per-step timings in ms and memory in bytes. Non-finite losses are stored
  explicitly: ``loss`` is NULL and ``loss_nonfinite`` says ``nan``, ``inf`` or ``-inf``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = ["Base", "Experiment", "Step", "STATUSES", "FINISHED_STATUSES", "utcnow"]

#: Lifecycle of an experiment. ``queued`` -> ``running`` -> one of the finished statuses.
STATUSES = ("queued", "running", "succeeded", "failed")
FINISHED_STATUSES = ("succeeded", "failed")


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of the ckptlab schema."""


class Experiment(Base):
    """One submitted experiment and its outcome."""

    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    model_kind: Mapped[str] = mapped_column(String(32))
    strategy: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    worker_id: Mapped[str | None] = mapped_column(String(128))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)

    steps: Mapped[list[Step]] = relationship(
        back_populates="experiment", cascade="all, delete-orphan", order_by="Step.step"
    )


class Step(Base):
    """One training step of one attempt: timings (ms) and memory (bytes)."""

    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("experiment_id", "attempt", "step", name="uq_steps_experiment_attempt_step"),
        Index("ix_steps_experiment_attempt", "experiment_id", "attempt"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    step: Mapped[int] = mapped_column(Integer)
    forward_ms: Mapped[float] = mapped_column(Float)
    backward_ms: Mapped[float] = mapped_column(Float)
    optimizer_ms: Mapped[float] = mapped_column(Float)
    step_ms: Mapped[float] = mapped_column(Float)
    allocated_bytes: Mapped[int] = mapped_column(BigInteger)
    peak_allocated_bytes: Mapped[int] = mapped_column(BigInteger)
    reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    loss: Mapped[float | None] = mapped_column(Float)
    loss_nonfinite: Mapped[str | None] = mapped_column(String(8))
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    experiment: Mapped[Experiment] = relationship(back_populates="steps")
