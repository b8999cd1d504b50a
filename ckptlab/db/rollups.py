"""Per-attempt rollups of the step series in the database (table ``step_rollups``,
:class:`ckptlab.db.models.StepRollup`; the arrays are :mod:`ckptlab.db.buckets`).

A rollup is a multi-resolution summary of one attempt's steps: at every level ``k`` of
:data:`ckptlab.db.buckets.LEVELS`, one row per bucket of ``2**k`` steps with its first and
last step and, for every series metric, the count of finite values, min and max with their
steps, and the values at the first and last step. A series request reads the coarsest level that still gives enough
buckets instead of the whole column, so its cost depends on the points asked for, not on
the run's length (``ckptlab.backend.services.series_view``); the extremes stay exact.

The rollup is written in the same transaction as the steps (:func:`add_rollup`, called by
:func:`ckptlab.db.store.add_steps`), merged into the buckets already stored; steps stored
another way (plain SQL, a restore) are rolled up again by :func:`rebuild_rollups`
(``ckptlab db rebuild-rollups``). The table holds about one row per 190 steps, each about
the size of four step rows: a few percent of the steps table.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Sequence

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
    "read_spans",
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


def read_buckets(session: Session, *, experiment_id: int, attempt: int, like: Buckets) -> Buckets:
    """The stored buckets of an attempt at the (level, bucket) ranges that ``like`` (sorted
    by level and bucket, as :mod:`ckptlab.db.buckets` gives them) spans: one query, sorted
    the same way."""
    if not len(like):
        return empty()
    ends = np.append(np.flatnonzero(like.level[1:] != like.level[:-1]), len(like) - 1)
    starts = np.concatenate([[0], ends[:-1] + 1])
    ranges = np.stack([like.level[starts], like.bucket[starts], like.bucket[ends]], axis=1)
    return read_spans(session, experiment_id=experiment_id, attempt=attempt, ranges=ranges)


def read_spans(session: Session, *, experiment_id: int, attempt: int, ranges: np.ndarray) -> Buckets:
    """The stored buckets of an attempt in ``ranges`` (rows of level, first and last bucket,
    as :func:`ckptlab.db.buckets.spans` gives them): one query, sorted by (level, bucket)."""
    if not len(ranges):
        return empty()
    args: list[int] = [experiment_id, attempt, *np.asarray(ranges, dtype=np.int64).ravel().tolist()]
    cur = session.connection().connection.dbapi_connection.cursor()
    try:
        cur.execute(_select_sql(placeholder(session), len(ranges)), args)
        rows = cur.fetchall()
    finally:
        cur.close()
    if not rows:
        return empty()
    table = np.array(rows, dtype=np.float64)
    table = table[np.lexsort((table[:, 1], table[:, 0]))]
    return Buckets(table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2:])


@functools.cache
def _select_sql(p: str, levels: int) -> str:
    ranges = " OR ".join([f"(level = {p} AND bucket BETWEEN {p} AND {p})"] * levels)
    return (
        f"SELECT level, bucket, {', '.join(ROLLUP_VALUE_COLUMNS)} FROM {_TABLE} "
        f"WHERE experiment_id = {p} AND attempt = {p} AND ({ranges})"
    )


def _write(session: Session, *, experiment_id: int, attempt: int, buckets: Buckets) -> None:
    """Merge ``buckets`` (of steps not rolled up yet) into the stored ones, in the database:
    one ``executemany`` of ``INSERT ... ON CONFLICT DO UPDATE`` whose update merges as
    :func:`ckptlab.db.buckets.combine` does (:func:`_merge_sql`), so no stored bucket is
    read back into Python."""
    if not len(buckets):
        return
    data = buckets.data
    missing = np.isnan(data)
    cells = data.astype(object)  # Python floats; then ints for counts and steps, None for NaN
    cells[:, INTEGER_COLUMNS] = np.where(missing, 0, data)[:, INTEGER_COLUMNS].astype(np.int64).astype(object)
    cells[missing] = None
    key = (experiment_id, attempt)
    rows = [
        (*key, level, bucket, *values)
        for level, bucket, values in zip(buckets.level.tolist(), buckets.bucket.tolist(), cells.tolist(), strict=True)
    ]
    cur = session.connection().connection.dbapi_connection.cursor()
    try:
        cur.executemany(_upsert_sql(placeholder(session)), rows)
    finally:
        cur.close()


def _merge_sets() -> list[str]:
    """The ``SET`` clauses that merge a stored bucket (``step_rollups.``) with a new one of
    other steps (``excluded.``) as :func:`ckptlab.db.buckets.combine` does: counts add up,
    the smaller min and the larger max win with their steps (the earlier step on a tie), and
    first and last come with the earlier first step and the later last step. SQLite and
    PostgreSQL evaluate every clause on the row as stored, so the order does not matter."""
    t, x = _TABLE, "excluded"

    def take(column: str, new_wins: str) -> str:
        return f"{column} = CASE WHEN {new_wins} THEN {x}.{column} ELSE {t}.{column} END"

    def add(column: str) -> str:
        return f"{column} = {t}.{column} + {x}.{column}"

    earlier, later = f"{x}.first_step < {t}.first_step", f"{x}.last_step > {t}.last_step"
    sets = [add("n_steps"), take("first_step", earlier), take("last_step", later)]
    for metric in SERIES_METRICS:
        sets.append(add(f"{metric}_count"))
        for stat, op in (("min", "<"), ("max", ">")):
            v, at = f"{metric}_{stat}", f"{metric}_{stat}_step"
            better = f"{t}.{v} IS NULL OR {x}.{v} {op} {t}.{v}"
            sets += [take(v, better), take(at, f"{better} OR ({x}.{v} = {t}.{v} AND {x}.{at} < {t}.{at})")]
        sets += [take(f"{metric}_first", earlier), take(f"{metric}_last", later)]
    return sets


@functools.cache
def _upsert_sql(p: str) -> str:
    return (
        f"INSERT INTO {_TABLE} ({', '.join((*_KEY, *ROLLUP_VALUE_COLUMNS))}) "
        f"VALUES ({', '.join([p] * (len(_KEY) + _NCOL))}) "
        f"ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET {', '.join(_merge_sets())}"
    )


def merge_buckets(session: Session, *, experiment_id: int, attempt: int, buckets: Buckets) -> int:
    """Merge ``buckets`` (of steps not rolled up yet) into the attempt's stored rollup, in
    the session's transaction (no commit); returns the rows sent."""
    _write(session, experiment_id=experiment_id, attempt=attempt, buckets=buckets)
    return len(buckets)


def add_rollup(
    session: Session,
    *,
    experiment_id: int,
    attempt: int,
    steps: np.ndarray | Sequence[int],
    values: np.ndarray | Sequence[Sequence[float | None]],
) -> int:
    """Roll up step rows just inserted in the session's transaction (no commit); they must
    be new to the attempt (:func:`ckptlab.db.store.add_steps` leaves out those already
    stored). Their buckets at every level are merged into the stored ones by the database
    (one ``executemany``).

    Args:
        steps: their step numbers.
        values: per row, the series metrics in :data:`ckptlab.domain.SERIES_METRICS` order
            (ms, bytes, loss; NaN, None or another non-finite value for no value).

    Returns:
        The rollup rows sent.
    """
    if not len(steps):
        return 0
    buckets = summarize(np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64))
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
    ``(rows, 3 + len(ROLLUP_STATS))``, columns ``n_steps``, ``first_step``, ``last_step``
    then the metric's stats in :data:`ROLLUP_STATS` order (NaN for NULL)."""
    if metric not in SERIES_METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    c = StepRollup.__table__.c
    stmt = (
        select(c.n_steps, c.first_step, c.last_step, *(c[f"{metric}_{s}"] for s in ROLLUP_STATS))
        .where(c.experiment_id == experiment_id, c.attempt == attempt, c.level == level)
        .where(c.bucket.between(first, last))
        .order_by(c.bucket)
    )
    cur = raw_cursor(session, stmt)
    try:
        rows = cur.fetchall()
    finally:
        cur.close()
    return np.array(rows, dtype=np.float64).reshape(len(rows), 3 + len(ROLLUP_STATS))


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
