"""Create and read experiments and their steps (CRUD), shared by the backend, the worker
and the CLI. Status changes are the queue protocol's (:mod:`ckptlab.db.queue`).

All functions take keyword-only arguments and a SQLAlchemy ``Session``; those that write
commit, so that readers in other processes see progress at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, selectinload

from ckptlab.db.database import is_postgresql
from ckptlab.db.events import record_events
from ckptlab.db.models import Experiment, Step, Sweep, utcnow
from ckptlab.db.queue import WORKER_LOST
from ckptlab.db.rollups import add_rollup
from ckptlab.domain import STEP_FIELDS, Status
from ckptlab.spec import ExperimentSpec
from ckptlab.sweeps import SweepPlan

__all__ = [
    "create_experiment",
    "add_steps",
    "list_experiments",
    "get_experiment",
    "list_steps",
    "last_step",
    "list_attempts",
    "Attempt",
    "create_sweep",
    "get_sweep",
]


def create_experiment(
    session: Session, *, spec: ExperimentSpec, status: Status = Status.QUEUED, worker_id: str | None = None
) -> Experiment:
    """Store a validated spec as a new experiment (``queued`` unless told otherwise: ``ckptlab
    run`` and ``ckptlab.profile`` store theirs ``running`` under their own worker id), with
    its first event."""
    now = utcnow()
    exp = Experiment(
        spec=spec.model_dump(mode="json"),
        model_kind=spec.model.kind,
        strategy=spec.checkpoint.strategy,
        status=status,
        created_at=now,
        attempt=1 if status == Status.RUNNING else 0,
        started_at=now if status == Status.RUNNING else None,
        worker_id=worker_id,
    )
    session.add(exp)
    session.flush()
    reason = "submitted" if status == Status.QUEUED else "started in the caller's process"
    record_events(session, [(exp.id, exp.attempt, worker_id)], status=status, reason=reason, at=now)
    session.commit()
    return exp


def _step_row(experiment_id: int, attempt: int, rec: Mapping[str, Any]) -> tuple[dict[str, Any], tuple]:
    """The ``steps`` row of one record, and its series values in
    :data:`ckptlab.domain.SERIES_METRICS` order (None for no value) for the rollup."""
    fields = tuple(map(rec.get, STEP_FIELDS))
    loss = rec.get("loss")
    nonfinite = None
    if loss is not None and not math.isfinite(loss):
        nonfinite = "nan" if math.isnan(loss) else ("inf" if loss > 0 else "-inf")
        loss = None
    row = dict(zip(STEP_FIELDS, fields, strict=True))
    row.update(
        experiment_id=experiment_id,
        attempt=attempt,
        step=rec["step"],
        loss=loss,
        loss_nonfinite=nonfinite,
        extra=rec.get("extra"),
    )
    return row, (*fields, loss)


def add_steps(
    session: Session,
    *,
    experiment_id: int,
    attempt: int,
    records: Iterable[Mapping[str, Any]],
    skip_existing: bool = False,
) -> int:
    """Insert step records in one batch with their rollup (:mod:`ckptlab.db.rollups`), in
    one transaction, and commit; returns the number of records given.

    A non-finite ``loss`` is stored as NULL with ``loss_nonfinite`` = ``nan``/``inf``/``-inf``.

    Args:
        skip_existing: silently skip records whose (experiment, attempt, step) is already
            stored (they are left out of the insert and of the rollup, so a batch can be
            retried after a commit whose outcome was unknown; a step given twice counts
            once). Default False: a duplicate raises ``sqlalchemy.exc.IntegrityError``.
    """
    pairs = [_step_row(experiment_id, attempt, r) for r in records]
    given = len(pairs)
    if pairs and skip_existing:
        pairs = _new_rows(session, experiment_id, attempt, pairs)
    if pairs:
        rows = [row for row, _ in pairs]
        stmt = Step.__table__.insert()
        if skip_existing:
            dialect_insert = postgresql.insert if is_postgresql(session) else sqlite.insert
            stmt = dialect_insert(Step.__table__).on_conflict_do_nothing(
                index_elements=["experiment_id", "attempt", "step"]
            )
        session.execute(stmt, rows)
        steps = [row["step"] for row in rows]
        add_rollup(session, experiment_id=experiment_id, attempt=attempt, steps=steps, values=[v for _, v in pairs])
        session.commit()
    return given


def _new_rows(session: Session, experiment_id: int, attempt: int, pairs: list[tuple[dict, tuple]]) -> list:
    """``pairs`` (see :func:`_step_row`) without the steps already stored for the attempt
    (one indexed range query) and without a second record of the same step."""
    steps = [row["step"] for row, _ in pairs]
    stored = set(
        session.scalars(
            select(Step.step).where(
                Step.experiment_id == experiment_id,
                Step.attempt == attempt,
                Step.step.between(min(steps), max(steps)),
            )
        )
    )
    if not stored and len(set(steps)) == len(steps):
        return pairs
    fresh = []
    for pair in pairs:
        if pair[0]["step"] not in stored:
            stored.add(pair[0]["step"])
            fresh.append(pair)
    return fresh


def list_experiments(
    session: Session, *, status: Status | None = None, offset: int = 0, limit: int = 100
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
    """The steps of an experiment's attempt (default: its current attempt), by step.

    Steps of other attempts (those lost with their worker) are never mixed in; list them
    with ``attempt=N`` (see :func:`list_attempts`).
    """
    if attempt is None:
        attempt = session.scalar(select(Experiment.attempt).where(Experiment.id == experiment_id)) or 1
    q = select(Step).where(Step.experiment_id == experiment_id, Step.attempt == attempt).order_by(Step.step)
    return list(session.scalars(q).all())


def last_step(session: Session, *, experiment_id: int, attempt: int) -> int:
    """The highest step stored for an experiment's attempt; 0 when none is."""
    q = select(func.max(Step.step)).where(Step.experiment_id == experiment_id, Step.attempt == attempt)
    return session.scalar(q) or 0


@dataclass(frozen=True)
class Attempt:
    """One attempt of an experiment.

    Attributes:
        attempt: the attempt number (1-based; the claim that started it).
        steps: how many steps of this attempt are stored.
        lost: the attempt ended without an outcome (its worker was lost, or it was requeued
            at shutdown); its steps are kept but are not the experiment's series.
        current: it is the experiment's current attempt (``experiments.attempt``).
    """

    attempt: int
    steps: int
    lost: bool
    current: bool


def list_attempts(session: Session, *, experiment_id: int) -> list[Attempt]:
    """Every attempt of an experiment, oldest first, with its step count and whether it was lost.

    Attempts ``1 .. experiments.attempt`` are listed (also those that stored no step). Every
    attempt before the current one was lost; the current one is lost too when the
    experiment went back to the queue, or failed with :data:`WORKER_LOST`. Returns an empty
    list for an unknown id or an experiment never claimed.
    """
    exp = session.get(Experiment, experiment_id)
    if exp is None:
        return []
    counts = dict(
        session.execute(
            select(Step.attempt, func.count()).where(Step.experiment_id == experiment_id).group_by(Step.attempt)
        ).all()
    )
    last = max([exp.attempt, *counts])
    current_lost = exp.status == Status.QUEUED or (exp.status == Status.FAILED and exp.error == WORKER_LOST)
    return [
        Attempt(
            attempt=n,
            steps=counts.get(n, 0),
            lost=n < exp.attempt or (n == exp.attempt and current_lost),
            current=n == exp.attempt,
        )
        for n in range(1, last + 1)
    ]


def create_sweep(
    session: Session, *, name: str, base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]], plan: SweepPlan
) -> Sweep:
    """Store a sweep and queue its runs (baselines first) in one transaction.

    Args:
        name: the sweep's name.
        base: the base spec as submitted.
        axes: the axes as submitted.
        plan: the result of :func:`plan_sweep` for ``base`` and ``axes``.

    Returns:
        The stored sweep (committed), its experiments loaded.
    """
    now = utcnow()
    sweep = Sweep(name=name, base=dict(base), axes=dict(axes), invalid=plan.invalid, created_at=now, cancelled=False)
    sweep.experiments = [
        Experiment(
            spec=run.spec.model_dump(mode="json"),
            model_kind=run.spec.model.kind,
            strategy=run.spec.checkpoint.strategy,
            status=Status.QUEUED,
            created_at=now,
            attempt=0,
        )
        for run in plan.runs
    ]
    session.add(sweep)
    session.flush()
    rows = [(e.id, 0, None) for e in sweep.experiments]
    record_events(session, rows, status=Status.QUEUED, reason=f"submitted with sweep {sweep.id}", at=now)
    session.commit()
    return sweep


def get_sweep(session: Session, *, sweep_id: int) -> Sweep | None:
    """One sweep with its experiments (by id), or None."""
    return session.scalars(
        select(Sweep)
        .where(Sweep.id == sweep_id)
        .options(selectinload(Sweep.experiments))
        .execution_options(populate_existing=True)
    ).first()
