"""Per-step series for the API: read a metric column fast, keep recent ones cached, and
downsample to a fixed number of points with MinMaxLTTB (tsdownsample) keeping the spikes."""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Select, func, literal, select
from sqlalchemy.orm import Session
from tsdownsample import MinMaxLTTBDownsampler

from ckptlab.db.buckets import level_for
from ckptlab.db.database import raw_cursor
from ckptlab.db.models import Experiment, Step
from ckptlab.domain import SERIES_METRICS, Status
from ckptlab.side_tasks import SideTask

log = logging.getLogger("ckptlab.api")

__all__ = [
    "SERIES_METRICS",
    "DEFAULT_MAX_POINTS",
    "Series",
    "SeriesCache",
    "warm_running_series",
    "series_warmer_task",
    "downsample_indices",
    "SeriesView",
    "downsample_series",
    "count_finite",
    "value_of",
]


def _column_array(session: Session, stmt: Select, dtype: Any) -> np.ndarray:
    cur = raw_cursor(session, stmt)
    try:
        return np.fromiter(itertools.chain.from_iterable(cur), dtype=dtype)
    finally:
        cur.close()


#: Points a series request returns unless it asks for another number (the page's charts).
DEFAULT_MAX_POINTS = 2000


def value_of(metric: str) -> Any:
    """The column of ``metric`` for a raw read: NULL (loss of a non-finite step, reserved
    bytes on CPU) reads as +inf, not finite, so it is left out like any non-finite value."""
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
    values = _column_array(session, select(value_of(metric)).where(*bounded).order_by(Step.step), np.float64)
    if hi - lo + 1 == len(values):  # steps lo..hi, none missing: no need to read them
        steps = np.arange(lo, hi + 1, dtype=np.int64)
    else:
        steps = _column_array(session, select(Step.step).where(*bounded).order_by(Step.step), np.int64)
    return Series(steps, values, int(last_id))


def _read_after(session: Session, experiment_id: int, attempt: int, metric: str, after_id: int) -> Series | None:
    stmt = (
        select(Step.id, Step.step, value_of(metric))
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


def warm_running_series(
    session: Session,
    cache: SeriesCache,
    *,
    metrics: Sequence[str] = SERIES_METRICS,
    max_points: int = DEFAULT_MAX_POINTS,
) -> int:
    """Bring the cached series of every running experiment that a request of
    ``max_points`` points reads whole up to date.

    Called every few seconds, this keeps a live run's series in memory at the cost of
    reading only its new steps. A run long enough to be drawn from its rollup
    (:func:`ckptlab.db.rollups.level_for`) is left out: its requests never read the whole
    column, and keeping ten million steps per metric warm would only churn the cache.

    Args:
        cache: the cache to fill.
        metrics: the metrics to keep warm (default: every series metric).
        max_points: the request to keep warm for (default: the API's default, 2000).

    Returns:
        How many running experiments were kept warm.
    """
    running = session.execute(
        select(Experiment.id, Experiment.attempt).where(Experiment.status == Status.RUNNING)
    ).all()
    warmed = 0
    for experiment_id, attempt in running:
        where = (Step.experiment_id == experiment_id, Step.attempt == attempt)
        lo = session.scalar(select(func.min(Step.step)).where(*where))
        hi = session.scalar(select(func.max(Step.step)).where(*where))
        if lo is None or level_for(hi - lo + 1, max_points) is None:
            for metric in metrics:
                cache.get(session, experiment_id=experiment_id, attempt=attempt, metric=metric)
            warmed += 1
        session.rollback()  # end the read transaction between experiments
    return warmed


def series_warmer_task(sessions: Callable[[], Session], cache: SeriesCache, *, interval_s: float) -> SideTask:
    """A side task named ``series-warmer`` running :func:`warm_running_series` every
    ``interval_s`` seconds (call ``start()`` on it). A pass that raises is logged and the
    loop restarted: a cold cache is slower, never wrong."""

    def warm() -> None:
        with sessions() as session:
            warm_running_series(session, cache)

    return SideTask("series-warmer", warm, interval_s=interval_s, run_first=False, restart=True)


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
        resolution: steps per bucket the points were picked from: 1 when every step was
            read, ``2**level`` when drawn from a rollup level.
    """

    x: list[int]
    y: list[float]
    total: int
    skipped: int
    min: tuple[int, float] | None
    max: tuple[int, float] | None
    resolution: int = 1


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
