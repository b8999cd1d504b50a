"""How far a queued or running experiment and a sweep have got (issue 23): the reads behind
``ExperimentPublic.progress`` and a sweep's ETA; the arithmetic is :mod:`ckptlab.analysis.progress`'s,
shared with ``ckptlab run``'s progress bar."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ckptlab.analysis.progress import RunProgress, run_progress
from ckptlab.db.database import is_postgresql
from ckptlab.db.models import Experiment, utcnow
from ckptlab.db.store import latest_step_record
from ckptlab.domain import Status

__all__ = ["experiment_progress", "first_started", "now_of"]


def now_of(session: Session) -> datetime:
    """Now on the clock the run times were written with: the database's on PostgreSQL
    (workers on other hosts stamp ``started_at`` with it), this process's on SQLite."""
    if is_postgresql(session):
        return session.scalar(select(func.now()))
    return utcnow()


def experiment_progress(session: Session, exp: Experiment) -> RunProgress | None:
    """A queued experiment's place in the queue (workers claim the lowest id first:
    :func:`ckptlab.db.queue.claim_next`), or a running one's last step, step total and
    ETA; None for a finished one. Two indexed queries at most."""
    if exp.status == Status.QUEUED:
        queued_before = (Experiment.status == Status.QUEUED, Experiment.id < exp.id)
        ahead = session.scalar(select(func.count()).select_from(Experiment).where(*queued_before))
        return RunProgress(queue_position=(ahead or 0) + 1)
    if exp.status != Status.RUNNING:
        return None
    last = latest_step_record(session, experiment_id=exp.id, attempt=exp.attempt)
    elapsed = (now_of(session) - exp.started_at).total_seconds() if exp.started_at else None
    return run_progress(
        spec=exp.spec if exp.experiment_spec is not None else {},  # a corrupt spec: the defaults
        last_step=last[0] if last else None,
        last_extra=last[1] if last else None,
        elapsed_s=None if elapsed is None else max(0.0, elapsed),
    )


def first_started(session: Session, sweep_ids: Sequence[int]) -> dict[int, datetime]:
    """When each sweep's first run started (sweeps none of whose runs started are absent)."""
    if not sweep_ids:
        return {}
    rows = session.execute(
        select(Experiment.sweep_id, func.min(Experiment.started_at))
        .where(Experiment.sweep_id.in_(list(sweep_ids)), Experiment.started_at.is_not(None))
        .group_by(Experiment.sweep_id)
    ).all()
    return {sid: started for sid, started in rows if isinstance(started, datetime)}  # not a corrupt value
