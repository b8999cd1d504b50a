"""The recorded history of experiments: one ``experiment_events`` row per status change,
written in the same transaction as the change by the only modules that change a status
(:mod:`ckptlab.db.queue`, :mod:`ckptlab.db.store`), after procrastinate's
``procrastinate_events``.

Example usage::

    with Session() as session:
        for e in history(session, experiment_id=7):
            print(e.at, e.status, e.attempt, e.worker_id, e.reason)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from ckptlab.db.database import db_now
from ckptlab.db.models import ExperimentEvent
from ckptlab.domain import Status

__all__ = ["record_events", "history", "first_line"]


def first_line(text: str | None, limit: int = 500) -> str | None:
    """The first line of an error text, at most ``limit`` characters (None stays None)."""
    if not text:
        return None
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:limit] or None


def record_events(
    session: Session,
    rows: Iterable[tuple[int, int, str | None]],
    *,
    status: Status | str,
    reason: str | None = None,
    at: datetime | None = None,
) -> None:
    """Add one event per changed experiment to the session's transaction (no commit: the
    caller commits it with the change itself).

    Args:
        rows: ``(experiment_id, attempt, worker_id)`` of each experiment that changed.
        status: the status they moved to.
        reason: why, in words (None when the status says it all).
        at: when (default: the database's clock, :func:`ckptlab.db.database.db_now`).
    """
    values = [
        {
            "experiment_id": eid,
            "attempt": attempt,
            "worker_id": worker_id,
            "status": Status(status).value,
            "reason": reason,
        }
        for eid, attempt, worker_id in rows
    ]
    if values:
        session.execute(insert(ExperimentEvent).values(at=at if at is not None else db_now(session)), values)


def history(session: Session, *, experiment_id: int) -> list[ExperimentEvent]:
    """Every recorded status change of an experiment, oldest first."""
    return list(
        session.scalars(
            select(ExperimentEvent).where(ExperimentEvent.experiment_id == experiment_id).order_by(ExperimentEvent.id)
        )
    )
