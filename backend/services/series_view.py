"""The answer to a series request: a metric over a step range, reduced to at most
``max_points`` points, with its exact extremes.

A long range is drawn from the run's rollup (:mod:`ckptlab.db.rollups`): the coarsest level
with enough buckets across the range (:func:`ckptlab.db.buckets.level_for`) gives each
bucket's first, min, max and last point, finer levels and single steps fill the range's
ragged ends, and MinMaxLTTB picks ``max_points`` among those. Its cost depends on
``max_points``, not on the run's length; the count and the extremes are exact, since each
bucket holds its own. A short range (under about ``64 * max_points`` steps) reads every
step in it: the whole run through the :class:`~ckptlab.backend.services.series.SeriesCache`, a
zoomed range with one indexed query. A rollup that does not reach the run's first or last
step (steps stored another way: ``ckptlab db rebuild-rollups``) is not used.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ckptlab.backend.services.series import (
    Series,
    SeriesCache,
    SeriesView,
    downsample_indices,
    downsample_series,
    value_of,
)
from ckptlab.db import rollups
from ckptlab.db.buckets import LEVELS, level_for
from ckptlab.db.database import raw_cursor
from ckptlab.db.models import ROLLUP_STATS, Step

log = logging.getLogger("ckptlab.api")

__all__ = ["read_view", "step_bounds"]

# read_metric's columns: n_steps, first_step, last_step, then the metric's stats
_COL = {"n_steps": 0, "first_step": 1, "last_step": 2, **{name: 3 + i for i, name in enumerate(ROLLUP_STATS)}}
_POINTS = (("first", "first_step"), ("min", "min_step"), ("max", "max_step"), ("last", "last_step"))


def step_bounds(session: Session, *, experiment_id: int, attempt: int) -> tuple[int, int] | None:
    """The first and last stored step of an attempt (two index lookups), or None."""
    where = (Step.experiment_id == experiment_id, Step.attempt == attempt)
    lo = session.scalar(select(func.min(Step.step)).where(*where))
    if lo is None:
        return None
    return int(lo), int(session.scalar(select(func.max(Step.step)).where(*where)))


def read_view(
    session: Session,
    cache: SeriesCache,
    *,
    experiment_id: int,
    attempt: int,
    metric: str,
    max_points: int,
    step_min: int | None = None,
    step_max: int | None = None,
) -> SeriesView:
    """At most ``max_points`` points of ``metric`` over steps ``step_min`` .. ``step_max``
    (inclusive; None: from the first / to the last stored step) of an attempt, with the
    exact count and extremes of that range.

    Args:
        metric: one of :data:`ckptlab.domain.SERIES_METRICS` (ms, bytes or loss).
        max_points: most points to return (at least 4).

    Returns:
        The view; its ``resolution`` is 1 when every step of the range was read, else the
        steps per bucket of the rollup level it was drawn from.
    """
    bounds = step_bounds(session, experiment_id=experiment_id, attempt=attempt)
    if bounds is None:
        return _empty()
    lo, hi = bounds
    a = step_min if step_min is not None and step_min > lo else None
    b = step_max if step_max is not None and step_max < hi else None
    first, last = lo if a is None else a, hi if b is None else b
    if first > last:
        return _empty()
    level = level_for(last - first + 1, max_points)
    if level is not None:
        held = rollups.coverage(session, experiment_id=experiment_id, attempt=attempt)
        if held is not None and held[:2] == bounds:
            return _from_rollup(session, experiment_id, attempt, metric, max_points, level, a, b, bounds)
        log.warning(
            "experiment %d attempt %d: its rollup holds steps %s of %d..%d; reading every step "
            "(run `ckptlab db rebuild-rollups --experiment %d`)",
            experiment_id,
            attempt,
            "none" if held is None else f"{held[0]}..{held[1]}",
            lo,
            hi,
            experiment_id,
        )
    if a is None and b is None:
        series = cache.get(session, experiment_id=experiment_id, attempt=attempt, metric=metric)
    else:
        series = _read_range(session, experiment_id, attempt, metric, first, last)
    return downsample_series(series, max_points=max_points)


def _empty() -> SeriesView:
    return SeriesView([], [], 0, 0, None, None)


def _read_range(session: Session, experiment_id: int, attempt: int, metric: str, first: int, last: int) -> Series:
    """Every step of ``first`` .. ``last`` (one indexed range query), in step order."""
    stmt = (
        select(Step.step, value_of(metric))
        .where(Step.experiment_id == experiment_id, Step.attempt == attempt, Step.step.between(first, last))
        .order_by(Step.step)
    )
    cur = raw_cursor(session, stmt)
    try:
        flat = np.fromiter(itertools.chain.from_iterable(cur), dtype=np.float64)
    finally:
        cur.close()
    rows = flat.reshape(-1, 2)
    return Series(rows[:, 0].astype(np.int64), rows[:, 1].copy(), 0)


def _cover(a: int, b: int, levels: tuple[int, ...]) -> list[tuple[int | None, int, int]]:
    """Steps ``a`` .. ``b`` as whole buckets, coarsest first: ``(level, first bucket, last
    bucket)`` where buckets of ``levels[0]`` fit, the ragged ends from the next levels, and
    ``(None, first step, last step)`` for what is left under the finest level."""
    if a > b:
        return []
    if not levels:
        return [(None, a, b)]
    k = levels[0]
    j0, j1 = -(-a >> k), ((b + 1) >> k) - 1  # the buckets wholly inside a..b
    if j0 > j1:
        return _cover(a, b, levels[1:])
    return [*_cover(a, (j0 << k) - 1, levels[1:]), (k, j0, j1), *_cover((j1 + 1) << k, b, levels[1:])]


def _from_rollup(
    session: Session,
    experiment_id: int,
    attempt: int,
    metric: str,
    max_points: int,
    level: int,
    a: int | None,
    b: int | None,
    bounds: tuple[int, int],
) -> SeriesView:
    """The view of ``a`` .. ``b`` from the rollup's ``level`` (an open end takes that
    level's whole first or last bucket: no step lies beyond it)."""
    size = 1 << level
    first = (bounds[0] >> level) * size if a is None else a
    last = ((bounds[1] >> level) + 1) * size - 1 if b is None else b
    finer = tuple(k for k in reversed(LEVELS) if k <= level)
    xs, ys = [], []
    count = rows = 0
    for k, start, end in _cover(first, last, finer):
        if k is None:
            raw = _read_range(session, experiment_id, attempt, metric, start, end)
            finite = np.isfinite(raw.values)
            xs.append(raw.steps[finite].astype(np.float64))
            ys.append(raw.values[finite])
            count += int(finite.sum())
            rows += len(raw.steps)
            continue
        got = rollups.read_metric(
            session, experiment_id=experiment_id, attempt=attempt, metric=metric, level=k, first=start, last=end
        )
        rows += int(got[:, _COL["n_steps"]].sum())
        count += int(got[:, _COL["count"]].sum())
        for value, step in _POINTS:
            xs.append(got[:, _COL[step]])
            ys.append(got[:, _COL[value]])
    x = np.concatenate(xs) if xs else np.empty(0)
    y = np.concatenate(ys) if ys else np.empty(0)
    keep = np.isfinite(y)  # NULL where a bucket has no value (at its first or last step, or at all)
    steps, first_of = np.unique(x[keep], return_index=True)  # one point per step, ascending
    steps, values = steps.astype(np.int64), y[keep][first_of]
    lo_hi = None, None
    if len(steps):
        i, j = int(np.argmin(values)), int(np.argmax(values))
        lo_hi = (int(steps[i]), float(values[i])), (int(steps[j]), float(values[j]))
    idx = downsample_indices(steps, values, max_points)
    return SeriesView(
        steps[idx].tolist(), values[idx].tolist(), count, rows - count, lo_hi[0], lo_hi[1], resolution=size
    )
