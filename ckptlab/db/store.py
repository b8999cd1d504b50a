"""Data-access functions shared by the backend, the worker and the CLI.

All take keyword-only arguments and a SQLAlchemy ``Session``; they commit when they change
state so that readers in other processes see progress at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ckptlab.db.models import Experiment, Step, utcnow
from ckptlab.spec import ExperimentSpec

__all__ = [
    "create_experiment",
    "claim_next",
    "add_steps",
    "finish_experiment",
    "list_experiments",
    "get_experiment",
    "list_steps",
    "STEP_FIELDS",
]

#: Numeric per-step fields a step record carries (times in ms, memory in bytes).
STEP_FIELDS = (
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "step_ms",
    "allocated_bytes",
    "peak_allocated_bytes",
    "reserved_bytes",
)


def create_experiment(
    session: Session, *, spec: ExperimentSpec, status: str = "queued", worker_id: str | None = None
) -> Experiment:
    """Store a validated spec as a new experiment (``queued`` unless told otherwise)."""
    now = utcnow()
    exp = Experiment(
        spec=spec.model_dump(mode="json"),
        model_kind=spec.model.kind,
        strategy=spec.checkpoint.strategy,
        status=status,
        created_at=now,
        attempt=1 if status == "running" else 0,
        started_at=now if status == "running" else None,
        worker_id=worker_id,
    )
    session.add(exp)
    session.commit()
    return exp


def claim_next(session: Session, *, worker_id: str) -> Experiment | None:
    """Atomically move the oldest queued experiment to ``running`` for ``worker_id``.

    One ``UPDATE ... WHERE status = 'queued' ... RETURNING`` statement, so two workers can
    never claim the same experiment: on SQLite the write lock serialises them; on PostgreSQL
    the inner select takes ``FOR UPDATE SKIP LOCKED``. Returns None when the queue is empty.
    """
    inner = select(Experiment.id).where(Experiment.status == "queued").order_by(Experiment.id).limit(1)
    if session.get_bind().dialect.name == "postgresql":
        inner = inner.with_for_update(skip_locked=True)
    stmt = (
        update(Experiment)
        .where(Experiment.id == inner.scalar_subquery(), Experiment.status == "queued")
        .values(
            status="running",
            worker_id=worker_id,
            started_at=utcnow(),
            attempt=Experiment.attempt + 1,
        )
        .returning(Experiment.id)
    )
    claimed = session.execute(stmt).scalar_one_or_none()
    session.commit()
    if claimed is None:
        return None
    return session.get(Experiment, claimed, populate_existing=True)


def _step_row(experiment_id: int, attempt: int, rec: Mapping[str, Any]) -> dict[str, Any]:
    loss = rec.get("loss")
    nonfinite = None
    if loss is not None and not math.isfinite(loss):
        nonfinite = "nan" if math.isnan(loss) else ("inf" if loss > 0 else "-inf")
        loss = None
    row = {k: rec.get(k) for k in STEP_FIELDS}
    row.update(
        experiment_id=experiment_id,
        attempt=attempt,
        step=rec["step"],
        loss=loss,
        loss_nonfinite=nonfinite,
        extra=rec.get("extra"),
    )
    return row


def add_steps(session: Session, *, experiment_id: int, attempt: int, records: Iterable[Mapping[str, Any]]) -> int:
    """Insert step records in one batch and commit; returns the number inserted.

    A non-finite ``loss`` is stored as NULL with ``loss_nonfinite`` = ``nan``/``inf``/``-inf``.
    """
    rows = [_step_row(experiment_id, attempt, r) for r in records]
    if rows:
        session.execute(Step.__table__.insert(), rows)
        session.commit()
    return len(rows)


def finish_experiment(
    session: Session,
    *,
    experiment_id: int,
    status: str,
    summary: Mapping[str, Any] | None = None,
    error: str | None = None,
) -> None:
    """Record the outcome of a running experiment (``succeeded`` or ``failed``)."""
    session.execute(
        update(Experiment)
        .where(Experiment.id == experiment_id)
        .values(status=status, summary=dict(summary) if summary else None, error=error, finished_at=utcnow())
    )
    session.commit()


def list_experiments(
    session: Session, *, status: str | None = None, offset: int = 0, limit: int = 100
) -> tuple[list[Experiment], int]:
    """Experiments, newest first, and the total count matching the filter."""
    q = select(Experiment)
    cq = select(func.count()).select_from(Experiment)
    if status:
        q = q.where(Experiment.status == status)
        cq = cq.where(Experiment.status == status)
    rows = session.scalars(q.order_by(Experiment.id.desc()).offset(offset).limit(limit)).all()
    return list(rows), session.scalar(cq) or 0


def get_experiment(session: Session, *, experiment_id: int) -> Experiment | None:
    """One experiment, or None."""
    return session.get(Experiment, experiment_id)


def list_steps(session: Session, *, experiment_id: int, attempt: int | None = None) -> list[Step]:
    """The steps of an experiment's attempt (default: its current attempt), by step."""
    if attempt is None:
        attempt = session.scalar(select(Experiment.attempt).where(Experiment.id == experiment_id)) or 1
    q = select(Step).where(Step.experiment_id == experiment_id, Step.attempt == attempt).order_by(Step.step)
    return list(session.scalars(q).all())
