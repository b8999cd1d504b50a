"""Medians with their spread, and overheads that are reported only when measurable."""

from __future__ import annotations

import random

import pytest

from ckptlab.analysis.stats import NOISE_THRESHOLD_PCT, RatioInterval, describe, ratio_ci


def _noisy(center: float, n: int, seed: int, jitter: float = 0.1) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-jitter, jitter)) for _ in range(n)]


def test_describe_gives_the_median_quartiles_and_an_interval_around_the_median():
    s = describe([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.n, s.median, s.q1, s.q3, s.iqr) == (5, 3.0, 2.0, 4.0, 2.0)
    assert 1.0 <= s.ci_low <= s.median <= s.ci_high <= 5.0
    assert describe([]) is None
    assert describe([7.0]).as_dict()["ci_low"] == 7.0


def test_an_outlier_moves_neither_the_median_nor_much_the_interval():
    calm = _noisy(10.0, 30, seed=1)
    spiky = [*calm[:-1], 760.0]  # a step that lost its core
    a, b = describe(calm), describe(spiky)
    assert abs(b.median - a.median) < 0.5 and b.ci_high < 12


def test_two_samples_of_the_same_distribution_show_no_measurable_difference():
    r = ratio_ci(_noisy(10.0, 20, seed=2), _noisy(10.0, 20, seed=3))
    assert r.low_pct < 0 < r.high_pct and not r.measurable


def test_a_real_slowdown_is_measurable_and_its_estimate_is_close():
    r = ratio_ci(_noisy(10.0, 20, seed=4, jitter=0.05), _noisy(13.0, 20, seed=5, jitter=0.05))
    assert r.measurable and r.low_pct > 20 and r.high_pct < 40
    assert r.estimate_pct == pytest.approx(30, abs=5)


def test_a_significant_difference_inside_the_noise_threshold_is_not_measurable():
    # Tight samples 1% apart: the interval excludes 0 but the estimate is below the threshold.
    r = ratio_ci(_noisy(10.0, 200, seed=8, jitter=0.002), _noisy(10.1, 200, seed=9, jitter=0.002))
    assert 0 < r.low_pct < r.high_pct < NOISE_THRESHOLD_PCT and not r.measurable
    assert r.as_dict()["threshold_pct"] == NOISE_THRESHOLD_PCT
    # A lower threshold (a quiet host) resolves it.
    base, run = _noisy(10.0, 200, seed=8, jitter=0.002), _noisy(10.1, 200, seed=9, jitter=0.002)
    assert ratio_ci(base, run, threshold_pct=0.5).measurable
    # A difference: the interval on one side of 0 and the estimate at least the threshold.
    assert RatioInterval(estimate_pct=3.0, low_pct=1.0, high_pct=5.0, threshold_pct=3.0).measurable
    assert RatioInterval(estimate_pct=-12.0, low_pct=-16.0, high_pct=-1.0).measurable
    assert not RatioInterval(estimate_pct=-6.1, low_pct=-10.1, high_pct=-3.2).measurable  # seen for equal work
    assert not RatioInterval(estimate_pct=15.0, low_pct=-1.0, high_pct=30.0).measurable


def test_the_interval_is_reproducible_and_empty_inputs_give_none():
    base, run = _noisy(10.0, 15, seed=6), _noisy(11.0, 15, seed=7)
    assert ratio_ci(base, run) == ratio_ci(base, run)
    assert ratio_ci([], run) is None and ratio_ci(base, []) is None and ratio_ci([0.0], run) is None
