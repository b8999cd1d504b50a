"""Read queries for the API: filtered experiment listings, per-step series (downsampled,
cached), step rows for exports and the incremental reads behind the live streams.

Kept apart from :mod:`ckptlab.db.store` (the queue protocol shared with the worker): these
functions only read.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Select, case, func, literal, select
from sqlalchemy.orm import Session
from tsdownsample import MinMaxLTTBDownsampler

from ckptlab.db.models import Experiment, Step
from ckptlab.db.store import STEP_FIELDS

log = logging.getLogger("ckptlab.api")

__all__ = [
    "SORT_COLUMNS",
    "SORT_KEYS",
    "SERIES_METRICS",
    "query_experiments",
    "Series",
    "SeriesCache",
    "warm_running_series",
    "start_series_warmer",
    "downsample_indices",
    "SeriesView",
    "downsample_series",
    "count_finite",
    "iter_step_rows",
    "StepRow",
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

#: Per-step columns a series can be drawn from (times in ms, memory in bytes).
SERIES_METRICS = (*STEP_FIELDS, "loss")


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


# --- series -------------------------------------------------------------------------------


def _raw_cursor(session: Session, stmt: Select) -> Any:
    """Execute ``stmt`` on the session's DBAPI connection and return the raw cursor.

    Skips SQLAlchemy's per-row result processing, which would double the time to read a
    million rows.
    """
    conn = session.connection()
    compiled = stmt.compile(dialect=conn.dialect)
    params = compiled.construct_params()
    args: Any = tuple(params[k] for k in compiled.positiontup) if compiled.positional else params
    cur = conn.connection.dbapi_connection.cursor()
    cur.execute(str(compiled), args)
    return cur


def _column_array(session: Session, stmt: Select, dtype: Any) -> np.ndarray:
    cur = _raw_cursor(session, stmt)
    try:
        return np.fromiter(itertools.chain.from_iterable(cur), dtype=dtype)
    finally:
        cur.close()


def _value(metric: str) -> Any:
    # NULL (loss of a non-finite step, reserved bytes on CPU) reads as +inf: not finite,
    # so it is left out of the series like any non-finite value.
    return func.coalesce(getattr(Step, metric), literal(float("inf")))


@dataclass
class Series:
    """A per-step metric of one attempt, every stored step, in step order.

    Attributes:
        steps: step numbers (int64).
        values: the metric (float64; non-finite where the step has no finite value).
        last_id: the largest step row id read (the next read starts after it).
    """

    steps: np.ndarray
    values: np.ndarray
    last_id: int

    @property
    def nbytes(self) -> int:
        """Memory held by the arrays, bytes."""
        return int(self.steps.nbytes + self.values.nbytes)


def _read_full(session: Session, experiment_id: int, attempt: int, metric: str) -> Series:
    where = (Step.experiment_id == experiment_id, Step.attempt == attempt)
    last_id = session.scalar(select(func.max(Step.id)).where(*where))
    if last_id is None:
        return Series(np.empty(0, np.int64), np.empty(0, np.float64), 0)
    lo = session.scalar(select(func.min(Step.step)).where(*where))
    hi = session.scalar(select(func.max(Step.step)).where(*where))
    bounded = (*where, Step.id <= last_id)
    values = _column_array(session, select(_value(metric)).where(*bounded).order_by(Step.step), np.float64)
    if hi - lo + 1 == len(values):  # steps lo..hi, none missing: no need to read them
        steps = np.arange(lo, hi + 1, dtype=np.int64)
    else:
        steps = _column_array(session, select(Step.step).where(*bounded).order_by(Step.step), np.int64)
    return Series(steps, values, int(last_id))


def _read_after(session: Session, experiment_id: int, attempt: int, metric: str, after_id: int) -> Series | None:
    stmt = (
        select(Step.id, Step.step, _value(metric))
        .where(Step.experiment_id == experiment_id, Step.attempt == attempt, Step.id > after_id)
        .order_by(Step.id)
    )
    flat = _column_array(session, stmt, np.float64)  # id, step, value per row (ids < 2**53)
    if not len(flat):
        return None
    rows = flat.reshape(-1, 3)
    return Series(rows[:, 1].astype(np.int64), rows[:, 2].copy(), int(rows[-1, 0]))


class SeriesCache:
    """Per-step series kept in memory between requests, least recently used dropped first.

    A cached series is brought up to date by reading only the steps stored after it (one
    indexed query), so repeated reads of a million-step run cost milliseconds; the first
    read of a series reads the whole column once. Safe to share between threads.

    Args:
        max_bytes: memory budget for cached arrays, bytes (0 disables caching).
    """

    def __init__(self, max_bytes: int = 256 * 2**20):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, int, str], Series] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[int, int, str], threading.Lock] = {}
        self._bytes = 0

    def get(self, session: Session, *, experiment_id: int, attempt: int, metric: str) -> Series:
        """The series of ``metric`` for the experiment's ``attempt``, including every step
        committed before this call.

        Args:
            experiment_id: the experiment.
            attempt: the attempt whose steps make the series.
            metric: one of :data:`SERIES_METRICS`.

        Raises:
            ValueError: ``metric`` is not a series metric.
        """
        if metric not in SERIES_METRICS:
            raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(SERIES_METRICS)}")
        key = (experiment_id, attempt, metric)
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:  # one reader per series: a second waits and gets the result
            with self._lock:
                cached = self._entries.get(key)
            if cached is None:
                series = _read_full(session, experiment_id, attempt, metric)
            else:
                new = _read_after(session, experiment_id, attempt, metric, cached.last_id)
                series = cached if new is None else _concat(cached, new)
            if series is not cached:
                self._put(key, series)
            else:
                with self._lock:
                    if key in self._entries:
                        self._entries.move_to_end(key)
        return series

    def _put(self, key: tuple[int, int, str], series: Series) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            if series.nbytes > self.max_bytes:
                return
            self._entries[key] = series
            self._bytes += series.nbytes
            while self._bytes > self.max_bytes:
                dropped_key, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.nbytes
                self._key_locks.pop(dropped_key, None)


def warm_running_series(session: Session, cache: SeriesCache, *, metrics: Sequence[str] = SERIES_METRICS) -> int:
    """Bring the cached series of every running experiment up to date.

    Called every few seconds, this keeps a live run's series in memory at the cost of
    reading only its new steps, so that even a million-step run is drawn without reading
    its whole column when someone opens it.

    Args:
        cache: the cache to fill.
        metrics: the metrics to keep warm (default: every series metric).

    Returns:
        How many running experiments were visited.
    """
    running = session.execute(select(Experiment.id, Experiment.attempt).where(Experiment.status == "running")).all()
    for experiment_id, attempt in running:
        for metric in metrics:
            cache.get(session, experiment_id=experiment_id, attempt=attempt, metric=metric)
        session.rollback()  # end the read transaction between experiments
    return len(running)


def start_series_warmer(
    sessions: Callable[[], Session], cache: SeriesCache, *, interval_s: float, stop: threading.Event
) -> threading.Thread:
    """Run :func:`warm_running_series` every ``interval_s`` seconds in a daemon thread until
    ``stop`` is set. Errors are logged and the next pass goes on."""

    def loop() -> None:
        while not stop.wait(interval_s):
            try:
                with sessions() as session:
                    warm_running_series(session, cache)
            except Exception:  # noqa: BLE001 - a failed pass must not end the thread
                log.exception("warming the series cache failed")

    thread = threading.Thread(target=loop, name="ckptlab-series-warmer", daemon=True)
    thread.start()
    return thread


def _concat(a: Series, b: Series) -> Series:
    steps = np.concatenate([a.steps, b.steps])
    values = np.concatenate([a.values, b.values])
    if len(a.steps) and len(b.steps) and b.steps.min() <= a.steps[-1]:
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
    return Series(steps, values, max(a.last_id, b.last_id))


def count_finite(values: np.ndarray) -> int:
    """How many entries of ``values`` are finite numbers."""
    return int(np.count_nonzero(np.isfinite(values)))


def downsample_indices(steps: np.ndarray, values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of at most ``max_points`` points that keep the shape of a series.

    MinMaxLTTB (tsdownsample): a min-max preselection keeps every spike, then
    largest-triangle-three-buckets picks the points that draw like the whole series. The
    global minimum and maximum are always among the indices. Non-finite values are skipped.

    Args:
        steps: x values, ascending (int64).
        values: y values (float64), same length.
        max_points: most points to return (at least 4).

    Returns:
        Ascending int64 indices into ``steps`` / ``values``.

    Raises:
        ValueError: ``max_points`` < 4 or the arrays differ in length.
    """
    if max_points < 4:
        raise ValueError("max_points must be at least 4")
    if len(steps) != len(values):
        raise ValueError("steps and values differ in length")
    finite = np.isfinite(values)
    valid = np.arange(len(values)) if finite.all() else np.flatnonzero(finite)
    if len(valid) <= max_points:
        return valid.astype(np.int64)
    y = values[valid]
    x = steps[valid]
    picked = MinMaxLTTBDownsampler().downsample(x, y, n_out=max_points - 2).astype(np.int64)
    extremes = np.array([np.argmin(y), np.argmax(y)], dtype=np.int64)
    return valid[np.union1d(picked, extremes)].astype(np.int64)


@dataclass(frozen=True)
class SeriesView:
    """A series reduced for drawing (see :func:`downsample_series`).

    Attributes:
        x: step numbers of the kept points, ascending.
        y: their values.
        total: steps with a finite value in the full series.
        skipped: steps without one (null or not finite).
        min: ``(step, value)`` of the global minimum, or None for an empty series.
        max: ``(step, value)`` of the global maximum, or None.
    """

    x: list[int]
    y: list[float]
    total: int
    skipped: int
    min: tuple[int, float] | None
    max: tuple[int, float] | None


def downsample_series(series: Series, *, max_points: int) -> SeriesView:
    """At most ``max_points`` points of ``series`` (:func:`downsample_indices`) and its
    global extremes.

    Args:
        series: the full series.
        max_points: most points to keep (at least 4).

    Raises:
        ValueError: ``max_points`` < 4.
    """
    idx = downsample_indices(series.steps, series.values, max_points)
    total = count_finite(series.values)
    x, y = series.steps[idx], series.values[idx]
    lo = hi = None
    if len(idx):
        lo = (int(x[y.argmin()]), float(y.min()))
        hi = (int(x[y.argmax()]), float(y.max()))
    return SeriesView(x.tolist(), y.tolist(), total, len(series.values) - total, lo, hi)


# --- exports and streams ------------------------------------------------------------------

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

    Cheap enough to poll several times a second: no JSON column is read.
    """
    rows = session.execute(
        select(Experiment.id, Experiment.status, Experiment.attempt, Experiment.error)
        .where(Experiment.id.in_(list(experiment_ids)))
        .order_by(Experiment.id)
    ).all()
    return [ExperimentState(*r) for r in rows]


def steps_after(
    session: Session, *, attempts: Sequence[tuple[int, int]], after_id: int, limit: int = 1000
) -> list[StepRow]:
    """Steps stored after row ``after_id`` for each ``(experiment_id, attempt)``, by row id.

    One indexed range query per pair (each cheap however many steps the experiment has).

    Args:
        attempts: ``(experiment_id, attempt)`` pairs to read.
        after_id: read rows with a larger id.
        limit: most rows to return (default 1000): the smallest ids across all pairs.
    """
    rows: list[StepRow] = []
    for experiment_id, attempt in attempts:
        q = (
            _step_select()
            .where(Step.experiment_id == experiment_id, Step.attempt == attempt, Step.id > after_id)
            .order_by(Step.id)
            .limit(limit)
        )
        rows += [_to_row(r) for r in session.execute(q).all()]
    rows.sort(key=lambda r: r.id)
    return rows[:limit]
