"""Medians with their spread, and overheads that are reported only when measurable."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ckptlab.analysis import stats
from ckptlab.analysis.stats import NOISE_THRESHOLD_PCT, RatioInterval, describe, ratio_ci
from ckptlab.summary import HostLoad, RunSummary


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


def test_the_same_samples_are_resampled_once(monkeypatch):
    calls = []
    resample = stats._resampled_medians
    monkeypatch.setattr(stats, "_resampled_medians", lambda *a: calls.append(len(a[0])) or resample(*a))
    base, run = _noisy(10.0, 30, seed=8), _noisy(12.0, 30, seed=9)
    first = ratio_ci(base, run, threshold_pct=1.0)
    assert ratio_ci(list(base), list(run), threshold_pct=1.0) is first and calls == [30, 30]
    assert ratio_ci(base, run, threshold_pct=2.0) is not first  # another question, answered anew
    assert ratio_ci(base, [*run[:-1], run[-1] + 1e-9], threshold_pct=1.0) is not first


@pytest.mark.parametrize("n", [1, 2, 5, 20, 21, 200])
def test_resampled_medians_have_the_distribution_of_index_resampling(n):
    """The order-statistic draw against the definition (resample indices, take the median):
    the same quantiles of the bootstrap distribution, to within Monte Carlo error."""
    x = np.random.default_rng(n).lognormal(0, 0.5, size=n)
    direct = np.median(x[np.random.default_rng(1).integers(0, n, size=(100_000, n))], axis=1)
    drawn = stats._resampled_medians(list(x), np.random.default_rng(2), 100_000)
    q = [2.5, 25, 50, 75, 97.5]
    assert np.percentile(drawn, q) == pytest.approx(np.percentile(direct, q), rel=0.02)


def test_a_90000_step_run_gets_a_narrow_interval_around_its_median():
    long = describe(_noisy(10.0, 90_000, seed=10))
    assert long.ci_low < long.median < long.ci_high and long.ci_high - long.ci_low < 0.05


def _load(share: float | None, load_1m: float = 1.0) -> HostLoad:
    return HostLoad(load_1m=load_1m, cpus=2, threads=1, cpu_share=share)


@pytest.mark.parametrize(
    ("a", "b", "comparable"),
    [
        (_load(0.98), _load(0.97), True),  # a quiet host, twice
        (_load(0.66, 3.0), _load(0.98), False),  # two busy loops beside the first
        (_load(0.66, 3.0), _load(0.67, 3.0), False),  # busy both times
        (_load(0.97), _load(0.86), False),  # the host's load moved between them
        (_load(None, 1.1), _load(None, 1.0), True),  # CUDA runs: by the load average
        (_load(None, 3.2), _load(None, 1.0), False),
        (None, _load(0.5, 3.0), True),  # stored before loads were recorded: as before
    ],
)
def test_separate_runs_are_compared_only_on_a_quiet_host(a, b, comparable):
    why = stats.separate_runs_not_comparable(a, b)
    assert (why is None) is comparable
    interval = stats.between_separate_runs(ratio_ci(_noisy(10.0, 30, seed=1), _noisy(14.0, 30, seed=2)), [a], [b])
    assert interval.measurable is comparable  # a 40% slowdown, called only where it may be
    if not comparable:
        assert why.startswith("separate runs on a busy host: not comparable (") and interval.not_comparable == why


def test_cpu_runs_on_different_heaps_are_never_compared():
    """A run whose heap kept freed memory against one whose steps faulted pages in (a run
    stored before ckptlab kept it: ``heap_kept`` unset): the step times differ by the faults
    alone, however quiet the host (DenseNet 69 against 99 ms, docs/benchmarks.md)."""
    kept, older = _load(0.98).model_copy(update={"heap_kept": True}), _load(0.98)
    why = stats.separate_runs_not_comparable(kept, older)
    assert why is not None and "heap" in why and why == stats.separate_runs_not_comparable(older, kept)
    assert stats.separate_runs_not_comparable(kept, kept.model_copy()) is None  # both kept, quiet host
    interval = stats.between_separate_runs(
        ratio_ci(_noisy(10.0, 30, seed=1), _noisy(14.0, 30, seed=2)), [kept], [older]
    )
    assert not interval.measurable and interval.not_comparable == why
    # a sharded run has no CPU share (its ranks wait in collectives): the heap still counts
    sharded = _load(None).model_copy(update={"heap_kept": True})
    assert stats.separate_runs_not_comparable(sharded, _load(None)) == why
    assert stats.separate_runs_not_comparable(_load(None), _load(None)) is None  # CUDA, or two older runs


def test_a_run_that_stored_its_heap_only_in_its_environment_is_read_as_it_was():
    """Runs stored before ``host_load.heap_kept`` kept their heap all the same and said so in
    ``environment.cpu_heap_kept``: a comparison reads that, on CPU only."""
    stored = {"device": "cpu", "environment": {"cpu_heap_kept": True}, "host_load": _load(0.98).model_dump()}
    assert RunSummary.load(stored).compared_load().heap_kept is True
    kept = _load(0.98).model_copy(update={"heap_kept": True})
    assert stats.separate_runs_not_comparable(RunSummary.load(stored).compared_load(), kept) is None
    older = {**stored, "environment": {}}
    assert RunSummary.load(older).compared_load().heap_kept is None
    cuda = {**stored, "device": "cuda:0"}
    assert RunSummary.load(cuda).compared_load().heap_kept is None


def test_fewer_than_five_rounds_are_never_measurable():
    few = ratio_ci([10.0, 10.1, 9.9, 10.0], [20.0, 20.1, 19.9, 20.0])
    assert few.rounds == 4 and not few.measurable and few.low_pct > 50
    assert ratio_ci(_noisy(10.0, 5, seed=3, jitter=0.01), _noisy(20.0, 5, seed=4, jitter=0.01)).measurable


def test_an_unmeasurable_overhead_says_why():
    """The plan page read "+33% (95% CI +20% to +41%), within the noise" over 3 rounds: the
    reason must come with the verdict."""
    few = RatioInterval(33.0, 20.0, 41.0, rounds=3)
    assert not few.measurable and few.unmeasured_why == "too few rounds (3; at least 5)"
    assert RatioInterval(4.0, -2.0, 9.0, rounds=20).unmeasured_why == "the 95% CI contains 0"
    small = RatioInterval(4.0, 2.0, 6.0, threshold_pct=10.0, rounds=20)
    assert small.unmeasured_why == "below the noise threshold (±10%)"
    assert RatioInterval(33.0, 20.0, 41.0, rounds=20).unmeasured_why is None
    assert RatioInterval(33.0, 20.0, 41.0, rounds=20).as_dict()["unmeasured_why"] is None
