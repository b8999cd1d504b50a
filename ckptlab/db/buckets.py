"""Rollup buckets as arrays: what :mod:`ckptlab.db.rollups` stores, computed with numpy.

A bucket of level ``k`` summarises steps ``bucket * 2**k`` to ``(bucket + 1) * 2**k - 1``:
how many step rows it holds and their first and last step, and for every series metric
(:data:`ckptlab.domain.SERIES_METRICS`) the stats of :data:`ckptlab.db.models.ROLLUP_STATS`
(count of finite values, min and max with their steps, the values at the first and last
step).
:func:`summarize` rolls up step rows at every level of :data:`LEVELS`; :func:`combine`
merges summaries of disjoint steps exactly, so a rollup written batch by batch equals one
computed at once. Pure: no database.

Buckets are float64 arrays, NaN for a stat with no finite value (steps are exact in
float64 up to 2**53).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckptlab.db.models import ROLLUP_STATS, ROLLUP_STEP_STATS, ROLLUP_VALUE_COLUMNS
from ckptlab.domain import SERIES_METRICS

__all__ = [
    "LEVELS",
    "POINTS_PER_BUCKET",
    "INTEGER_COLUMNS",
    "Buckets",
    "level_for",
    "summarize",
    "finest",
    "spans",
    "roll_up",
    "combine",
    "empty",
]

#: Levels ``k`` of the rollup: buckets of ``2**k`` steps (256 steps to about a million).
#: The finest level holds one row per 256 steps, all levels together one per about 190.
LEVELS: tuple[int, ...] = (8, 10, 12, 14, 16, 18, 20)
#: A bucket gives a series at most four points: its first, min, max and last.
POINTS_PER_BUCKET = 4

_NCOL = len(ROLLUP_VALUE_COLUMNS)
_S = len(ROLLUP_STATS)
_HEAD = 3  # n_steps, first_step, last_step: then the metrics' stats, _S columns each
_ST = {name: i for i, name in enumerate(ROLLUP_STATS)}
#: Which of :data:`ROLLUP_VALUE_COLUMNS` hold counts or steps (integer columns).
INTEGER_COLUMNS = np.array(
    [i < _HEAD or ROLLUP_STATS[(i - _HEAD) % _S] in ROLLUP_STEP_STATS for i in range(_NCOL)], dtype=bool
)


def level_for(span: int, max_points: int) -> int | None:
    """The level to draw ``span`` steps with at most ``max_points`` points from: the
    coarsest with at least ``max_points`` buckets across the span, or the finest when its
    buckets give at least ``max_points`` points (:data:`POINTS_PER_BUCKET` each); None when
    the span is shorter (about ``64 * max_points`` steps): read every step of it."""
    for k in reversed(LEVELS):
        if span >> k >= max_points:
            return k
    return LEVELS[0] if (span >> LEVELS[0]) * POINTS_PER_BUCKET >= max_points else None


@dataclass(frozen=True)
class Buckets:
    """Rollup buckets as arrays, one row per (level, bucket).

    Attributes:
        level: the level ``k`` of each row (int64): buckets of ``2**k`` steps.
        bucket: the bucket number (int64): steps ``bucket * 2**k`` .. ``(bucket + 1) * 2**k - 1``.
        data: float64 ``(rows, len(ROLLUP_VALUE_COLUMNS))`` in that column order; NaN where a
            metric has no finite value in the bucket (its count is 0).
    """

    level: np.ndarray
    bucket: np.ndarray
    data: np.ndarray

    def __len__(self) -> int:
        return len(self.level)

    def stat(self, name: str) -> np.ndarray:
        """One stat of every metric, ``(rows, len(SERIES_METRICS))`` (a view of :attr:`data`)."""
        return self.data[:, _HEAD + _ST[name] :: _S]


def empty() -> Buckets:
    """No buckets."""
    return Buckets(np.empty(0, np.int64), np.empty(0, np.int64), np.empty((0, _NCOL)))


def summarize(steps: np.ndarray, values: np.ndarray) -> Buckets:
    """The rollup of some step rows at every level of :data:`LEVELS`
    (:func:`roll_up` of :func:`finest`).

    Args:
        steps: step numbers (int), each at most once; any order.
        values: float ``(len(steps), len(SERIES_METRICS))``, the metrics in that order;
            a non-finite value (NaN for NULL) counts as no value.

    Returns:
        Buckets sorted by (level, bucket). Buckets of these steps only: merge them into
        stored ones with :func:`combine` (the steps must not overlap).

    Raises:
        ValueError: a step occurs twice, or the shapes do not match.
    """
    return roll_up(finest(steps, values))


def finest(steps: np.ndarray, values: np.ndarray) -> Buckets:
    """The buckets of the finest level (``LEVELS[0]``) of some step rows; arguments and
    errors as :func:`summarize`."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (len(steps), len(SERIES_METRICS)):
        raise ValueError(f"values must be ({len(steps)}, {len(SERIES_METRICS)}), not {values.shape}")
    if not len(steps):
        return empty()
    if len(steps) > 1 and not (np.diff(steps) > 0).all():
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
        if (np.diff(steps) == 0).any():
            raise ValueError("a step occurs twice")
    return _finest(steps, values)


def spans(buckets: Buckets) -> np.ndarray:
    """``(level, first bucket, last bucket)`` per level, int64 ``(levels, 3)``, of the
    buckets that finest-level ``buckets`` fall in at every level of :data:`LEVELS`: where
    stored buckets to merge them with can be."""
    if not len(buckets):
        return np.empty((0, 3), np.int64)
    lo, hi = int(buckets.bucket.min()), int(buckets.bucket.max())
    return np.array([(k, lo >> (k - LEVELS[0]), hi >> (k - LEVELS[0])) for k in LEVELS], dtype=np.int64)


def roll_up(fine: Buckets, *, onto: Buckets | None = None) -> Buckets:
    """Finest-level buckets (:func:`finest`) carried up to every level of :data:`LEVELS`,
    merged with ``onto`` (buckets of other steps at any level) in the same pass when given;
    sorted by (level, bucket)."""
    n = len(fine)
    if not n:
        return combine(onto) if onto is not None else empty()
    up = np.array(LEVELS[1:], np.int64)
    level = np.concatenate([fine.level, np.repeat(up, n)])
    bucket = np.concatenate([fine.bucket, (fine.bucket[None, :] >> (up[:, None] - LEVELS[0])).ravel()])
    data = np.concatenate([fine.data, np.tile(fine.data, (len(up), 1))])
    if onto is not None and len(onto):
        return combine(onto, Buckets(level, bucket, data))
    return _reduce(level, bucket, data)  # sorted as built: by level, then bucket


def _finest(steps: np.ndarray, values: np.ndarray) -> Buckets:
    """Buckets of the finest level straight from step rows sorted by step (the general
    :func:`_reduce` would first expand every row into a bucket of its own). Works on the
    values transposed, one contiguous row per metric: ``reduceat`` along contiguous memory
    is an order of magnitude faster than across it."""
    n = len(steps)
    bucket = steps >> LEVELS[0]
    starts = np.concatenate([[0], np.flatnonzero(bucket[1:] != bucket[:-1]) + 1])
    ends = np.append(starts[1:], n)
    sizes = ends - starts
    v = np.ascontiguousarray(values.T)  # (metrics, rows)
    finite = np.isfinite(v)
    if not finite.all():
        v = np.where(finite, v, np.nan)
    at = steps.astype(np.float64)
    out = np.empty((len(starts), _NCOL))
    out[:, 0] = sizes
    out[:, 1] = steps[starts]
    out[:, 2] = steps[ends - 1]

    def put(stat: str, value: np.ndarray) -> None:
        out[:, _HEAD + _ST[stat] :: _S] = value.T

    count = np.add.reduceat(finite, starts, axis=1, dtype=np.int64)
    put("count", count)
    for value, step, pick in (("min", "min_step", np.fmin), ("max", "max_step", np.fmax)):
        best = pick.reduceat(v, starts, axis=1)
        put(value, best)
        hit = v == np.repeat(best, sizes, axis=1)
        put(step, np.fmin.reduceat(np.where(hit, at, np.nan), starts, axis=1))
    put("first", v[:, starts])
    put("last", v[:, ends - 1])
    return Buckets(np.full(len(starts), LEVELS[0], np.int64), bucket[starts], out)


def combine(*parts: Buckets) -> Buckets:
    """One set of buckets from summaries of disjoint steps: rows with the same (level,
    bucket) are merged (counts added, the smaller min and larger max with their steps, a
    tie going to the earlier step; first and last from the row with the earliest first step
    and the latest last step). Sorted by (level, bucket)."""
    parts = tuple(p for p in parts if len(p))
    if not parts:
        return empty()
    level = np.concatenate([p.level for p in parts])
    bucket = np.concatenate([p.bucket for p in parts])
    data = np.concatenate([p.data for p in parts])
    order = np.lexsort((bucket, level))
    return _reduce(level[order], bucket[order], data[order])


def _reduce(level: np.ndarray, bucket: np.ndarray, data: np.ndarray) -> Buckets:
    """Merge runs of rows with equal (level, bucket); the rows come sorted by them."""
    n = len(level)
    change = np.flatnonzero((level[1:] != level[:-1]) | (bucket[1:] != bucket[:-1])) + 1
    starts = np.concatenate([[0], change])
    if len(starts) == n:
        return Buckets(level, bucket, data)
    group = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    out = np.empty((len(starts), _NCOL))
    out[:, 0] = np.add.reduceat(data[:, 0], starts)
    out[:, 1] = np.fmin.reduceat(data[:, 1], starts)
    out[:, 2] = np.fmax.reduceat(data[:, 2], starts)

    def col(stat: str) -> np.ndarray:
        return data[:, _HEAD + _ST[stat] :: _S]

    def put(stat: str, value: np.ndarray) -> None:
        out[:, _HEAD + _ST[stat] :: _S] = value

    put("count", np.add.reduceat(col("count"), starts, axis=0))
    for value, step, pick in (("min", "min_step", np.fmin), ("max", "max_step", np.fmax)):
        best = pick.reduceat(col(value), starts, axis=0)
        put(value, best)
        put(step, np.fmin.reduceat(np.where(col(value) == best[group], col(step), np.nan), starts, axis=0))
    # first and last: the rows holding the group's first and last step (one each: the
    # merged summaries hold disjoint steps); NaN stays NaN (no value at that step)
    rows = np.arange(n)
    for value, edge in (("first", 1), ("last", 2)):
        at = np.minimum.reduceat(np.where(data[:, edge] == out[group, edge], rows, n), starts)
        put(value, col(value)[at])
    return Buckets(level[starts], bucket[starts], out)
