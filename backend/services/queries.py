"""Read queries for the API: filtered experiment listings, step rows for exports and the
incremental reads behind the live streams. They only read; writes are
:mod:`ckptlab.db.store`'s and :mod:`ckptlab.db.queue`'s."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, case, func, or_, select
from sqlalchemy.orm import Session

from ckptlab.db.models import Experiment, Step
from ckptlab.domain import STEP_FIELDS

__all__ = [
    "SORT_COLUMNS",
    "SORT_KEYS",
    "query_experiments",
    "STEP_COLUMNS",
    "StepRow",
    "iter_step_rows",
    "ExperimentState",
    "experiment_states",
    "steps_after",
]

#: Columns ``GET /api/experiments?sort=`` may order by (prefix ``-`` for descending).
SORT_COLUMNS = {
    "id": Experiment.id,
    "created_at": Experiment.created_at,
    "started_at": Experiment.started_at,
    "finished_at": Experiment.finished_at,
    "status": Experiment.status,
    "model_kind": Experiment.model_kind,
    "strategy": Experiment.strategy,
    "sweep_id": Experiment.sweep_id,
    "attempt": Experiment.attempt,
}
SORT_KEYS = tuple(k for c in SORT_COLUMNS for k in (c, f"-{c}"))


def query_experiments(
    session: Session,
    *,
    status: str | None = None,
    sweep_id: int | None = None,
    model_kind: str | None = None,
    strategy: str | None = None,
    ids: Sequence[int] | None = None,
    sort: str | None = None,
    offset: int = 0,
    limit: int | None = 100,
) -> tuple[list[Experiment], int]:
    """Experiments matching every given filter, one page of them, and the total count.

    Args:
        status, sweep_id, model_kind, strategy: equality filters (None: any).
        ids: only these experiment ids (None: any).
        sort: a key of :data:`SORT_KEYS` (``-`` prefix for descending; ties by id). Default:
            newest first, or the order of ``ids`` when they are given.
        offset: rows to skip (default 0).
        limit: most rows to return (default 100; None: all).

    Returns:
        ``(rows, total)`` where ``total`` counts every match before offset and limit.

    Raises:
        ValueError: ``sort`` is not in :data:`SORT_KEYS`.
    """
    conditions = []
    if status is not None:
        conditions.append(Experiment.status == status)
    if sweep_id is not None:
        conditions.append(Experiment.sweep_id == sweep_id)
    if model_kind is not None:
        conditions.append(Experiment.model_kind == model_kind)
    if strategy is not None:
        conditions.append(Experiment.strategy == strategy)
    if ids is not None:
        conditions.append(Experiment.id.in_(list(ids)))
    q = select(Experiment).where(*conditions)
    if sort is not None:
        if sort not in SORT_KEYS:
            raise ValueError(f"cannot sort by {sort!r}; expected one of {', '.join(SORT_KEYS)}")
        col = SORT_COLUMNS[sort.lstrip("-")]
        order = [(col.desc() if sort.startswith("-") else col.asc()).nulls_last(), Experiment.id.asc()]
    elif ids:
        order = [case({i: n for n, i in enumerate(ids)}, value=Experiment.id)]
    else:
        order = [Experiment.id.desc()]
    q = q.order_by(*order).offset(offset)
    if limit is not None:
        q = q.limit(limit)
    total = session.scalar(select(func.count()).select_from(Experiment).where(*conditions)) or 0
    return list(session.scalars(q).all()), total


#: Columns of a step row in exports and live events, in order.
STEP_COLUMNS = ("step", *STEP_FIELDS, "loss", "loss_nonfinite")


@dataclass(frozen=True)
class StepRow:
    """A step as the exports and streams send it.

    Attributes:
        id: the step row id (the stream cursor).
        experiment_id: its experiment.
        attempt: its attempt.
        data: :data:`STEP_COLUMNS` -> value.
    """

    id: int
    experiment_id: int
    attempt: int
    data: dict[str, Any]


def _step_select() -> Select:
    return select(Step.id, Step.experiment_id, Step.attempt, *(getattr(Step, c) for c in STEP_COLUMNS))


def _to_row(r: Sequence[Any]) -> StepRow:
    return StepRow(id=r[0], experiment_id=r[1], attempt=r[2], data=dict(zip(STEP_COLUMNS, r[3:], strict=True)))


def iter_step_rows(session: Session, *, experiment_id: int, attempt: int, chunk: int = 5000) -> Iterator[StepRow]:
    """Every step of one attempt in step order, read ``chunk`` rows at a time.

    Args:
        experiment_id: the experiment.
        attempt: the attempt.
        chunk: rows per query (default 5000); memory stays bounded for long runs.
    """
    last = None
    while True:
        q = _step_select().where(Step.experiment_id == experiment_id, Step.attempt == attempt)
        if last is not None:
            q = q.where(Step.step > last)
        rows = session.execute(q.order_by(Step.step).limit(chunk)).all()
        yield from (_to_row(r) for r in rows)
        if len(rows) < chunk:
            return
        last = rows[-1][3]


@dataclass(frozen=True)
class ExperimentState:
    """What a live stream watches of an experiment.

    Attributes:
        id, status, attempt: as stored.
        error: the error text (None unless it failed).
    """

    id: int
    status: str
    attempt: int
    error: str | None


def experiment_states(session: Session, *, experiment_ids: Sequence[int]) -> list[ExperimentState]:
    """Status, attempt and error of each experiment in ``experiment_ids`` (by id).

    Cheap enough to poll several times a second: no JSON column is read. A stored attempt
    that is not an integer (a corrupt row, :mod:`ckptlab.db.corrupt`) reads as 0, as the
    row itself does.
    """
    rows = session.execute(
        select(Experiment.id, Experiment.status, Experiment.attempt, Experiment.error)
        .where(Experiment.id.in_(list(experiment_ids)))
        .order_by(Experiment.id)
    ).all()
    return [
        ExperimentState(i, status, attempt if isinstance(attempt, int) else 0, error)
        for i, status, attempt, error in rows
    ]


def steps_after(
    session: Session, *, attempts: Sequence[tuple[int, int]], after_id: int, limit: int = 1000
) -> list[StepRow]:
    """Steps stored after row ``after_id`` for each ``(experiment_id, attempt)``, by row id.

    One statement for all pairs, so every pair is read from the same snapshot: with one
    statement per pair, a step committed between two statements could carry an id below
    the largest id returned, and a stream's cursor would then skip it for good.

    Args:
        attempts: ``(experiment_id, attempt)`` pairs to read.
        after_id: read rows with a larger id.
        limit: most rows to return (default 1000): the smallest ids across all pairs.
    """
    if not attempts:
        return []
    match = or_(*(and_(Step.experiment_id == e, Step.attempt == a) for e, a in attempts))
    q = _step_select().where(match, Step.id > after_id).order_by(Step.id).limit(limit)
    return [_to_row(r) for r in session.execute(q).all()]
