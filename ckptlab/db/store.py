"""Create and read experiments and their steps (CRUD), shared by the backend, the worker
and the CLI. Status changes are the queue protocol's (:mod:`ckptlab.db.queue`).

All functions take keyword-only arguments and a SQLAlchemy ``Session``; those that write
commit, so that readers in other processes see progress at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, selectinload

from ckptlab.db.database import is_postgresql, placeholder
from ckptlab.db.events import record_events
from ckptlab.db.models import PREDICTION_STATUSES, Experiment, Prediction, PredictionTimeline, Step, Sweep, utcnow
from ckptlab.db.queue import WORKER_LOST
from ckptlab.db.rollups import add_rollup
from ckptlab.domain import SERIES_METRICS, STEP_FIELDS, Status
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.sweeps import SweepPlan
from ckptlab.summary import RunSummary

__all__ = [
    "create_experiment",
    "add_steps",
    "list_experiments",
    "get_experiment",
    "list_steps",
    "last_step",
    "latest_step_record",
    "list_attempts",
    "Attempt",
    "create_sweep",
    "get_sweep",
    "create_prediction",
    "get_prediction",
    "list_predictions",
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


def _step_rows(
    experiment_id: int, attempt: int, records: Iterable[Mapping[str, Any]], *, values: bool
) -> tuple[list[dict], list]:
    """The ``steps`` rows of the records and, with ``values``, flat, each record's step and
    series values in :data:`ckptlab.domain.SERIES_METRICS` order (None for no value): what
    the rollup reads, gathered in the same pass."""
    rows: list[dict[str, Any]] = []
    flat: list[Any] = []
    for rec in records:
        loss = rec.get("loss")
        nonfinite = None
        if loss is not None and not math.isfinite(loss):
            nonfinite = "nan" if math.isnan(loss) else ("inf" if loss > 0 else "-inf")
            loss = None
        step = rec["step"]
        fields = list(map(rec.get, STEP_FIELDS))
        row = dict(zip(STEP_FIELDS, fields, strict=True))
        row["experiment_id"] = experiment_id
        row["attempt"] = attempt
        row["step"] = step
        row["loss"] = loss
        row["loss_nonfinite"] = nonfinite
        row["extra"] = rec.get("extra")
        rows.append(row)
        if values:
            flat.append(step)
            flat += fields
            flat.append(loss)
    return rows, flat


def add_steps(
    session: Session,
    *,
    experiment_id: int,
    attempt: int,
    records: Iterable[Mapping[str, Any]],
    skip_existing: bool = False,
    rollup: bool = True,
) -> int:
    """Insert step records in one batch with their rollup (:mod:`ckptlab.db.rollups`), in
    one transaction, and commit; returns the number of records given.

    A non-finite ``loss`` is stored as NULL with ``loss_nonfinite`` = ``nan``/``inf``/``-inf``.

    Args:
        skip_existing: silently skip records whose (experiment, attempt, step) is already
            stored (they are left out of the insert and of the rollup, so a batch can be
            retried after a commit whose outcome was unknown; a step given twice counts
            once). Default False: a duplicate raises ``sqlalchemy.exc.IntegrityError``.
        rollup: write the rollup with the steps (default). False: the steps alone, as
            before rollups existed (a bulk load that calls
            :func:`ckptlab.db.rollups.rebuild_rollups` once at the end; the benchmark that
            prices the rollup); series requests read such an attempt step by step until then.
    """
    if not rollup:
        rows, _ = _step_rows(experiment_id, attempt, records, values=False)
        if rows:
            session.execute(_insert_or_skip(session) if skip_existing else Step.__table__.insert(), rows)
            session.commit()
        return len(rows)
    rows, flat = _step_rows(experiment_id, attempt, records, values=True)
    given = len(rows)
    if not rows:
        return 0
    steps, values = _rollup_input(flat, len(rows))
    if skip_existing:
        keep = _new_steps(session, experiment_id, attempt, steps)
        if keep is not None:
            rows = [row for row, new in zip(rows, keep.tolist(), strict=True) if new]
            steps, values = steps[keep], values[keep]
    if rows:
        session.execute(_insert_or_skip(session) if skip_existing else Step.__table__.insert(), rows)
        add_rollup(session, experiment_id=experiment_id, attempt=attempt, steps=steps, values=values)
        session.commit()
    return given


def _new_steps(session: Session, experiment_id: int, attempt: int, steps: np.ndarray) -> np.ndarray | None:
    """Which of ``steps`` are not stored for the attempt yet and not a repeat of an earlier
    one in ``steps`` (a mask), or None when all of them are new. One indexed range query,
    hand-written: it runs with every batch, and compiling it would cost more than running
    it. (``INSERT ... RETURNING`` would name the inserted rows too, but on PostgreSQL it
    turns the batch insert into multi-row statements that cost several times as much.)"""
    p = placeholder(session)
    cur = session.connection().connection.dbapi_connection.cursor()
    try:
        cur.execute(
            f"SELECT step FROM steps WHERE experiment_id = {p} AND attempt = {p} AND step BETWEEN {p} AND {p}",
            (experiment_id, attempt, int(steps.min()), int(steps.max())),
        )
        stored = {row[0] for row in cur.fetchall()}
    finally:
        cur.close()
    if not stored and (len(steps) < 2 or bool((np.diff(steps) > 0).all())):
        return None
    keep = np.ones(len(steps), dtype=bool)
    for i, step in enumerate(steps.tolist()):
        if step in stored:
            keep[i] = False
        stored.add(step)
    return keep


def _rollup_input(flat: list[Any], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Steps (int64) and series values (float64 ``(n, len(SERIES_METRICS))``, NaN for None)
    from :func:`_step_rows`' flat list: one conversion, about twice as fast as from a list
    of rows."""
    table = np.array(flat, dtype=np.float64).reshape(n, 1 + len(SERIES_METRICS))
    return table[:, 0].astype(np.int64), table[:, 1:]


def _insert_or_skip(session: Session) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING`` into ``steps`` on the session's dialect."""
    dialect_insert = postgresql.insert if is_postgresql(session) else sqlite.insert
    return dialect_insert(Step.__table__).on_conflict_do_nothing(index_elements=["experiment_id", "attempt", "step"])


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


def latest_step_record(
    session: Session, *, experiment_id: int, attempt: int
) -> tuple[int, dict[str, Any] | None] | None:
    """The step number and ``extra`` of an attempt's latest step, or None before its first
    (one indexed read: what progress reports, :mod:`ckptlab.analysis.progress`)."""
    row = session.execute(
        select(Step.step, Step.extra)
        .where(Step.experiment_id == experiment_id, Step.attempt == attempt)
        .order_by(Step.step.desc())
        .limit(1)
    ).first()
    return None if row is None else (row.step, row.extra)


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


def create_prediction(
    session: Session,
    *,
    spec: ExperimentSpec,
    target: str,
    status: Status,
    capacity_bytes: int | None = None,
    summary: RunSummary | None = None,
    error: str | None = None,
    created_at: datetime | None = None,
    finished_at: datetime | None = None,
    elapsed_s: float | None = None,
    commit: bool = True,
    timelines: Sequence[Mapping[str, Any]] = (),
) -> Prediction:
    """Store one finished prediction (``predictions``) and, by default, commit.

    Args:
        spec: the validated spec predicted.
        target: the target's name (not checked here: the callers validate it).
        status: how it ended, one of :data:`ckptlab.db.models.PREDICTION_STATUSES`.
        capacity_bytes: the capacity the verdict was taken against when given (bytes).
        summary: the predicted summary (stored as its ``dump()``), when it succeeded.
        error: one sentence saying why it did not succeed.
        created_at, finished_at: UTC; default now (``finished_at``: now).
        elapsed_s: seconds it took.
        commit: False leaves the transaction open (a batch stores its rows in one).
        timelines: the memory timelines its fake memory pass kept, stored with it (only
            with a prediction that succeeded): the columns of
            :class:`~ckptlab.db.models.PredictionTimeline` but ``prediction_id``
            (:func:`ckptlab.analysis.timeline_rows.timeline_row`).

    Raises:
        ValueError: ``status`` is not a prediction's status (the CHECK constraint would
            refuse it too).
    """
    if status not in PREDICTION_STATUSES:
        raise ValueError(f"a prediction is {', '.join(PREDICTION_STATUSES)}, not {status!r}")
    now = utcnow()
    row = Prediction(
        spec=spec.model_dump(mode="json"),
        target=target,
        capacity_bytes=capacity_bytes,
        status=Status(status),
        summary=summary.dump() if summary is not None else None,
        error=error,
        created_at=created_at or now,
        finished_at=finished_at or now,
        elapsed_s=elapsed_s,
        model_kind=spec.model.kind,
        strategy=spec.checkpoint.strategy,
    )
    session.add(row)
    session.flush()
    if timelines and status == Status.SUCCEEDED:
        session.add_all(PredictionTimeline(**t, prediction_id=row.id) for t in timelines)
        session.flush()
    if commit:
        session.commit()
    return row


def get_prediction(session: Session, *, prediction_id: int) -> Prediction | None:
    """One prediction, or None."""
    return session.get(Prediction, prediction_id)


def list_predictions(
    session: Session,
    *,
    target: str | None = None,
    status: Status | None = None,
    model_kind: str | None = None,
    offset: int = 0,
    limit: int | None = 100,
) -> tuple[list[Prediction], int]:
    """Predictions matching every filter given, newest first, and how many match in all.

    Args:
        target, status, model_kind: keep only these (None: any).
        offset, limit: the page; ``limit=None`` returns every match (the export's rows).
    """
    where = []
    if target is not None:
        where.append(Prediction.target == target)
    if status is not None:
        where.append(Prediction.status == status)
    if model_kind is not None:
        where.append(Prediction.model_kind == model_kind)
    q = select(Prediction).where(*where).order_by(Prediction.id.desc()).offset(offset)
    rows = session.scalars(q if limit is None else q.limit(limit)).all()
    count = session.scalar(select(func.count()).select_from(Prediction).where(*where)) or 0
    return list(rows), count
