"""Per-attempt rollups of the step series in the database (table ``step_rollups``,
:class:`ckptlab.db.models.StepRollup`; the arrays are :mod:`ckptlab.db.buckets`).

A rollup is a multi-resolution summary of one attempt's steps: at every level ``k`` of
:data:`ckptlab.db.buckets.LEVELS`, one row per bucket of ``2**k`` steps with, for every
series metric, the count of finite values, min and max with their steps, and first and
last with their steps. A series request reads the coarsest level that still gives enough
buckets instead of the whole column, so its cost depends on the points asked for, not on
the run's length (``backend.services.series_view``); the extremes stay exact.

The rollup is written in the same transaction as the steps (:func:`add_rollup`, called by
:func:`ckptlab.db.store.add_steps`), merged into the buckets already stored; steps stored
another way (plain SQL, a restore) are rolled up again by :func:`rebuild_rollups`
(``ckptlab db rebuild-rollups``). The table holds about one row per 190 steps, each about
the size of four step rows: a few percent of the steps table.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import delete, func, literal, select
from sqlalchemy.orm import Session

from ckptlab.db.buckets import INTEGER_COLUMNS, LEVELS, Buckets, combine, empty, summarize
from ckptlab.db.database import placeholder, raw_cursor
from ckptlab.db.models import ROLLUP_STATS, ROLLUP_VALUE_COLUMNS, Step, StepRollup
from ckptlab.domain import SERIES_METRICS

__all__ = [
    "ROLLUP_REVISION",
    "add_rollup",
    "merge_buckets",
    "read_buckets",
    "coverage",
    "read_metric",
    "attempts_with_steps",
    "rebuild_attempt",
    "rebuild_rollups",
]

#: The migration whose table :data:`ROLLUP_VALUE_COLUMNS` describes. A migration fills the
#: rollup with this code only when it is the one named here; one that changes the table's
#: columns names itself here and rebuilds.
ROLLUP_REVISION = "0007"

_NCOL = len(ROLLUP_VALUE_COLUMNS)
_KEY = ("experiment_id", "attempt", "level", "bucket")
_TABLE = StepRollup.__table__.name


def _columns_sql() -> str:
    return ", ".join((*_KEY, *ROLLUP_VALUE_COLUMNS))


def read_buckets(session: Session, *, experiment_id: int, attempt: int, like: Buckets) -> Buckets:
    """The stored buckets of an attempt at the (level, bucket) ranges that ``like`` spans
    (one query), sorted by (level, bucket)."""
    if not len(like):
        return empty()
    ranges = []
    args: list[int] = [experiment_id, attempt]
    for k in np.unique(like.level):
        at = like.bucket[like.level == k]
        ranges.append("(level = {p} AND bucket BETWEEN {p} AND {p})")
        args += [int(k), int(at.min()), int(at.max())]
    p = placeholder(session)
    sql = (
        f"SELECT level, bucket, {', '.join(ROLLUP_VALUE_COLUMNS)} FROM {_TABLE} "
        f"WHERE experiment_id = {p} AND attempt = {p} AND ({' OR '.join(ranges).format(p=p)})"
    )
    cur = session.connection().connection.dbapi_connection.cursor()
    try:
        cur.execute(sql, args)
        rows = cur.fetchall()
    finally:
        cur.close()
    if not rows:
        return empty()
    table = np.array(rows, dtype=np.float64)
    return combine(Buckets(table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2:]))


def _write(session: Session, *, experiment_id: int, attempt: int, buckets: Buckets) -> None:
    """Insert or replace ``buckets`` (one executemany on the session's connection)."""
    if not len(buckets):
        return
    missing = np.isnan(buckets.data)
    cols: list[list[Any]] = []
    for j in range(_NCOL):
        column = buckets.data[:, j]
        if INTEGER_COLUMNS[j]:
            values = np.where(missing[:, j], 0, column).astype(np.int64).tolist()
        else:
            values = column.tolist()
        for i in np.flatnonzero(missing[:, j]).tolist():
            values[i] = None
        cols.append(values)
    n = len(buckets)
    rows = list(
        zip(
            itertools.repeat(experiment_id, n),
            itertools.repeat(attempt, n),
            buckets.level.tolist(),
            buckets.bucket.tolist(),
            *cols,
            strict=False,
        )
    )
    p = placeholder(session)
    update = ", ".join(f"{c} = excluded.{c}" for c in ROLLUP_VALUE_COLUMNS)
    sql = (
        f"INSERT INTO {_TABLE} ({_columns_sql()}) VALUES ({', '.join([p] * (len(_KEY) + _NCOL))}) "
        f"ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET {update}"
    )
    cur = session.connection().connection.dbapi_connection.cursor()
    try:
        cur.executemany(sql, rows)
    finally:
        cur.close()


def merge_buckets(session: Session, *, experiment_id: int, attempt: int, buckets: Buckets) -> int:
    """Merge ``buckets`` (of steps not rolled up yet) into the attempt's stored rollup, in
    the session's transaction (no commit); returns the rows written."""
    merged = combine(read_buckets(session, experiment_id=experiment_id, attempt=attempt, like=buckets), buckets)
    _write(session, experiment_id=experiment_id, attempt=attempt, buckets=merged)
    return len(merged)


def add_rollup(
    session: Session,
    *,
    experiment_id: int,
    attempt: int,
    steps: Sequence[int],
    values: Sequence[Sequence[float | None]],
) -> int:
    """Roll up step rows just inserted in the session's transaction (no commit); they must
    be new to the attempt (:func:`ckptlab.db.store.add_steps` leaves out those already
    stored).

    Args:
        steps: their step numbers.
        values: per row, the series metrics in :data:`ckptlab.domain.SERIES_METRICS` order
            (ms, bytes, loss; None or non-finite for no value).

    Returns:
        The rollup rows written.
    """
    if not len(steps):
        return 0
    # A flat list converts about twice as fast as a list of rows.
    flat = np.array(list(itertools.chain.from_iterable(values)), dtype=np.float64)
    buckets = summarize(np.asarray(steps, dtype=np.int64), flat.reshape(len(steps), len(SERIES_METRICS)))
    return merge_buckets(session, experiment_id=experiment_id, attempt=attempt, buckets=buckets)


def coverage(session: Session, *, experiment_id: int, attempt: int) -> tuple[int, int, int] | None:
    """``(first step, last step, step rows)`` the attempt's rollup holds (from its coarsest
    level), or None when it has none. Compared with the steps table's first and last step,
    this tells a rollup that misses steps appended another way."""
    top = StepRollup.__table__.c
    row = session.execute(
        select(func.min(top.first_step), func.max(top.last_step), func.sum(top.n_steps)).where(
            top.experiment_id == experiment_id, top.attempt == attempt, top.level == LEVELS[-1]
        )
    ).one()
    return None if row[0] is None else (int(row[0]), int(row[1]), int(row[2]))


def read_metric(
    session: Session, *, experiment_id: int, attempt: int, metric: str, level: int, first: int, last: int
) -> np.ndarray:
    """The buckets ``first`` .. ``last`` of one level for one metric, by bucket: float64
    ``(rows, 1 + len(ROLLUP_STATS))``, columns ``n_steps`` then the metric's stats in
    :data:`ROLLUP_STATS` order (NaN for NULL)."""
    if metric not in SERIES_METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    c = StepRollup.__table__.c
    stmt = (
        select(c.n_steps, *(c[f"{metric}_{s}"] for s in ROLLUP_STATS))
        .where(c.experiment_id == experiment_id, c.attempt == attempt, c.level == level)
        .where(c.bucket.between(first, last))
        .order_by(c.bucket)
    )
    cur = raw_cursor(session, stmt)
    try:
        rows = cur.fetchall()
    finally:
        cur.close()
    return np.array(rows, dtype=np.float64).reshape(len(rows), 1 + len(ROLLUP_STATS))


# ------------------------------------------------------------------ rebuild


def attempts_with_steps(session: Session, *, experiment_id: int | None = None) -> list[tuple[int, int, int]]:
    """``(experiment id, attempt, step rows)`` of every attempt that has steps (of one
    experiment when given), in that order."""
    stmt = select(Step.experiment_id, Step.attempt, func.count()).group_by(Step.experiment_id, Step.attempt)
    if experiment_id is not None:
        stmt = stmt.where(Step.experiment_id == experiment_id)
    return [(int(e), int(a), int(n)) for e, a, n in session.execute(stmt.order_by(Step.experiment_id, Step.attempt))]


def _read_chunk(session: Session, experiment_id: int, attempt: int, after: int | None, limit: int):
    # NULL reads as +inf (no value), as in the series; steps after ``after``, in order.
    cols = [func.coalesce(getattr(Step, m), literal(float("inf"))) for m in SERIES_METRICS]
    stmt = select(Step.step, *cols).where(Step.experiment_id == experiment_id, Step.attempt == attempt)
    if after is not None:
        stmt = stmt.where(Step.step > after)
    cur = raw_cursor(session, stmt.order_by(Step.step).limit(limit))
    try:
        flat = np.fromiter(itertools.chain.from_iterable(cur), dtype=np.float64)
    finally:
        cur.close()
    table = flat.reshape(-1, 1 + len(SERIES_METRICS))
    return table[:, 0].astype(np.int64), table[:, 1:]


def rebuild_attempt(
    session: Session,
    *,
    experiment_id: int,
    attempt: int,
    chunk_rows: int = 1 << 16,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Recompute one attempt's rollup from its stored steps and replace the stored one, in
    one write at the end (the steps are read first, ``chunk_rows`` at a time, so the write
    lock is held only for the write); commits. ``progress(rows)`` is called after each
    chunk read. Returns the step rows rolled up."""
    parts: list[Buckets] = []
    after: int | None = None
    total = 0
    while True:
        steps, values = _read_chunk(session, experiment_id, attempt, after, chunk_rows)
        if not len(steps):
            break
        parts.append(summarize(steps, values))
        total += len(steps)
        after = int(steps[-1])
        if progress is not None:
            progress(len(steps))
        if len(steps) < chunk_rows:
            break
    t = StepRollup.__table__
    session.execute(delete(t).where(t.c.experiment_id == experiment_id, t.c.attempt == attempt))
    _write(session, experiment_id=experiment_id, attempt=attempt, buckets=combine(*parts))
    session.commit()
    return total


def rebuild_rollups(
    session: Session,
    *,
    experiment_id: int | None = None,
    progress: Callable[[int], None] | None = None,
    attempts: Iterable[tuple[int, int, int]] | None = None,
) -> list[tuple[int, int, int]]:
    """Recompute the rollup of every attempt with steps (of one experiment when given) and
    drop rollups whose attempt has no steps left; commits after each attempt.

    Args:
        experiment_id: only this experiment (default: all).
        progress: called with the step rows read after each chunk (for a progress bar).
        attempts: the attempts to rebuild, as :func:`attempts_with_steps` lists them
            (default: that list, read here).

    Returns:
        ``(experiment id, attempt, step rows)`` of each attempt rebuilt.
    """
    todo = list(attempts) if attempts is not None else attempts_with_steps(session, experiment_id=experiment_id)
    t = StepRollup.__table__
    stored = select(t.c.experiment_id, t.c.attempt).distinct()
    if experiment_id is not None:
        stored = stored.where(t.c.experiment_id == experiment_id)
    keep = {(e, a) for e, a, _ in todo}
    for e, a in session.execute(stored).all():
        if (e, a) not in keep:
            session.execute(delete(t).where(t.c.experiment_id == e, t.c.attempt == a))
    session.commit()
    for e, a, _ in todo:
        rebuild_attempt(session, experiment_id=e, attempt=a, progress=progress)
    return todo
