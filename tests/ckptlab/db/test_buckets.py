"""Rollup buckets: every level's count, extremes with their steps, values at the first and
last step match a plain per-bucket computation; summaries of parts combine into the summary of the whole; the
level a request reads depends on its points, not on the run's length."""

from __future__ import annotations

import numpy as np
import pytest

from ckptlab.db.buckets import LEVELS, Buckets, combine, level_for, summarize
from ckptlab.db.models import ROLLUP_STATS
from ckptlab.domain import SERIES_METRICS

M = len(SERIES_METRICS)


def reference(steps: np.ndarray, values: np.ndarray, level: int) -> dict[int, list[float]]:
    """Per bucket of ``level``: n_steps, first and last step, then per metric the stats of
    ROLLUP_STATS, by brute force (ties: the earliest step; first and last: the values at
    the first and last step, NaN when not finite)."""
    out = {}
    for b in np.unique(steps >> level):
        inside = (steps >> level) == b
        s, v = steps[inside], values[inside]
        order = np.argsort(s)
        s, v = s[order], v[order]
        row = [len(s), s[0], s[-1]]
        for j in range(M):
            ok = np.isfinite(v[:, j])
            ss, vv = s[ok], v[ok, j]
            if not len(vv):
                row += [0] + [np.nan] * (len(ROLLUP_STATS) - 1)
                continue
            at_first = v[0, j] if np.isfinite(v[0, j]) else np.nan
            at_last = v[-1, j] if np.isfinite(v[-1, j]) else np.nan
            row += [len(vv), vv.min(), ss[np.argmin(vv)], vv.max(), ss[np.argmax(vv)], at_first, at_last]
        out[int(b)] = row
    return out


def as_dict(buckets: Buckets, level: int) -> dict[int, list[float]]:
    at = buckets.level == level
    return {int(b): list(row) for b, row in zip(buckets.bucket[at], buckets.data[at], strict=True)}


@pytest.fixture
def run() -> tuple[np.ndarray, np.ndarray]:
    """12,000 steps from 3 with gaps, values with NaN and inf (no value), ties, and one
    metric that never has a value (reserved bytes on CPU)."""
    rng = np.random.default_rng(7)
    steps = np.arange(3, 15_003)
    steps = steps[rng.random(len(steps)) > 0.05]  # about 5% missing steps
    values = rng.normal(10, 2, (len(steps), M)).round(1)  # rounded: many equal values
    values[rng.random(values.shape) < 0.1] = np.nan
    values[rng.random(values.shape) < 0.01] = np.inf
    values[:, SERIES_METRICS.index("reserved_bytes")] = np.nan
    values[4000:4600, 0] = 5.0  # a long tie across buckets: the earliest step wins
    return steps, values


def test_every_level_matches_a_per_bucket_computation(run):
    steps, values = run
    got = summarize(steps, values)
    for level in LEVELS:
        expected = reference(steps, values, level)
        assert set(as_dict(got, level)) == set(expected), level
        for b, row in as_dict(got, level).items():
            np.testing.assert_array_equal(np.array(row), np.array(expected[b], dtype=float), err_msg=f"{level}/{b}")
    assert (np.diff(got.level) >= 0).all()


def test_parts_combine_into_the_whole_in_any_order(run):
    steps, values = run
    whole = summarize(steps, values)
    rng = np.random.default_rng(1)
    cuts = np.sort(rng.choice(np.arange(1, len(steps)), 9, replace=False))  # mid-bucket cuts
    parts = [summarize(s, v) for s, v in zip(np.split(steps, cuts), np.split(values, cuts), strict=True)]
    for merged in (combine(*parts), combine(*parts[::-1]), combine(combine(*parts[:4]), combine(*parts[4:]))):
        np.testing.assert_array_equal(merged.level, whole.level)
        np.testing.assert_array_equal(merged.bucket, whole.bucket)
        np.testing.assert_array_equal(merged.data, whole.data)
    shuffled = rng.permutation(len(steps))
    np.testing.assert_array_equal(summarize(steps[shuffled], values[shuffled]).data, whole.data)


def test_a_step_given_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        summarize(np.array([5, 3, 5]), np.ones((3, M)))
    with pytest.raises(ValueError):
        summarize(np.array([1, 2]), np.ones((2, M - 1)))
    assert len(summarize(np.array([], dtype=np.int64), np.empty((0, M)))) == 0


@pytest.mark.parametrize(
    ("span", "points", "level"),
    [
        (1_000_000, 2000, 8),  # 3906 buckets of 256 (1024 would give 976)
        (10_000_000, 2000, 12),  # 2441 buckets of 4096
        (10_000_000, 10, 18),  # 38 buckets of 2**18 (2**20 would give 9)
        (2**31, 2000, 20),
        (200_000, 2000, 8),  # 781 buckets of 256: 3124 points
        (128_000, 2000, 8),  # 500 buckets: 2000 points, just enough
        (127_000, 2000, None),  # short: read every step
        (1_000_000, 20_000, None),
    ],
)
def test_the_level_read_depends_on_the_points_not_the_runs_length(span, points, level):
    assert level_for(span, points) == level
