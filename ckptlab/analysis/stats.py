"""Statistics for noisy timings: median, interquartile range, and bootstrap 95% confidence
intervals of a median and of a ratio of medians.

Timings on a shared machine are skewed and have outliers (another process takes the core),
so ckptlab reports medians with their spread, never means, and calls a difference real only
when its confidence interval excludes zero (Efron & Tibshirani, *An Introduction to the
Bootstrap*, 1993, ch. 13: percentile intervals) and its estimate is at least the noise
threshold (:data:`NOISE_THRESHOLD_PCT` by default; after criterion.rs's ``noise_threshold``: a change
smaller than the machine reproduces is noise even when it is significant, because the steps
of one run share its conditions and the bootstrap over steps does not see the run-to-run
part of the noise). The resampling is seeded, so the same
samples always give the same interval. Pure Python: no numpy, no torch.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ckptlab.domain import NOISE_THRESHOLD_PCT

__all__ = [
    "Spread",
    "describe",
    "RatioInterval",
    "ratio_ci",
    "paired_ratio_ci",
    "BOOTSTRAP_RESAMPLES",
    "CONFIDENCE",
    "NOISE_THRESHOLD_PCT",
]

#: Bootstrap resamples per interval (2,000 keeps the 2.5 / 97.5 percentiles stable to ~1%).
BOOTSTRAP_RESAMPLES = 2000
#: Two-sided confidence level of every interval.
CONFIDENCE = 0.95
_SEED = 20161104  # fixed: the same samples give the same interval


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 1] of already sorted values."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def _resampled_medians(samples: Sequence[float], rng: random.Random, n: int) -> list[float]:
    k = len(samples)
    return [statistics.median(rng.choices(samples, k=k)) for _ in range(n)]


@dataclass(frozen=True)
class Spread:
    """Median and spread of one phase's timings (ms).

    Attributes:
        n: number of samples.
        median: the median.
        q1, q3: first and third quartiles (interquartile range ``q3 - q1``).
        ci_low, ci_high: bootstrap 95% confidence interval of the median.
    """

    n: int
    median: float
    q1: float
    q3: float
    ci_low: float
    ci_high: float

    @property
    def iqr(self) -> float:
        """Interquartile range ``q3 - q1``."""
        return self.q3 - self.q1

    def as_dict(self) -> dict[str, float | int]:
        """JSON-able: ``n, median, q1, q3, iqr, ci_low, ci_high``."""
        return {**asdict(self), "iqr": self.iqr}


def describe(samples: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES) -> Spread | None:
    """Median, quartiles and the bootstrap 95% CI of the median of ``samples``.

    Args:
        samples: timings (any unit; the result has the same unit).
        resamples: bootstrap resamples (default :data:`BOOTSTRAP_RESAMPLES`).

    Returns:
        The spread, or None when there is no sample.
    """
    if not samples:
        return None
    ordered = sorted(float(s) for s in samples)
    boot = sorted(_resampled_medians(ordered, random.Random(_SEED), resamples))
    alpha = (1 - CONFIDENCE) / 2
    return Spread(
        n=len(ordered),
        median=float(statistics.median(ordered)),
        q1=_percentile(ordered, 0.25),
        q3=_percentile(ordered, 0.75),
        ci_low=_percentile(boot, alpha),
        ci_high=_percentile(boot, 1 - alpha),
    )


@dataclass(frozen=True)
class RatioInterval:
    """How much slower (positive) or faster (negative) a run is than its baseline, in %.

    Attributes:
        estimate_pct: ``100 * (median(run) / median(baseline) - 1)``.
        low_pct, high_pct: bootstrap 95% confidence interval of the same quantity, from
            resampling each sample set independently.
        threshold_pct: the noise threshold the estimate must reach to count (default
            :data:`NOISE_THRESHOLD_PCT`).
    """

    estimate_pct: float
    low_pct: float
    high_pct: float
    threshold_pct: float = NOISE_THRESHOLD_PCT

    @property
    def measurable(self) -> bool:
        """Whether there is a difference to report: the interval excludes 0 and the estimate
        is at least ``threshold_pct`` away from 0."""
        excludes_zero = self.low_pct > 0 or self.high_pct < 0
        return excludes_zero and abs(self.estimate_pct) >= self.threshold_pct

    def as_dict(self) -> dict[str, float | bool]:
        """JSON-able: ``estimate_pct, low_pct, high_pct, threshold_pct, measurable``."""
        return {**asdict(self), "measurable": self.measurable}


def ratio_ci(
    baseline: Sequence[float],
    samples: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    threshold_pct: float = NOISE_THRESHOLD_PCT,
) -> RatioInterval | None:
    """The overhead of ``samples`` over ``baseline`` in % with a bootstrap 95% CI.

    Args:
        baseline: timings of the baseline (strategy ``none``), e.g. step times in ms.
        samples: timings of the run compared, same unit.
        resamples: bootstrap resamples (default :data:`BOOTSTRAP_RESAMPLES`).
        threshold_pct: noise threshold of :attr:`RatioInterval.measurable` (default
            :data:`NOISE_THRESHOLD_PCT`; a worker host's figure from ``bench/bench_noise.py``).

    Returns:
        The interval, or None when either set is empty or the baseline median is not
        positive.
    """
    if not baseline or not samples:
        return None
    base_median = statistics.median(baseline)
    if base_median <= 0:
        return None
    rng = random.Random(_SEED)
    b = _resampled_medians(list(baseline), rng, resamples)
    s = _resampled_medians(list(samples), rng, resamples)
    ratios = sorted(100.0 * (sm / bm - 1.0) for sm, bm in zip(s, b, strict=True) if bm > 0)
    alpha = (1 - CONFIDENCE) / 2
    return RatioInterval(
        estimate_pct=100.0 * (statistics.median(samples) / base_median - 1.0),
        low_pct=_percentile(ratios, alpha),
        high_pct=_percentile(ratios, 1 - alpha),
        threshold_pct=threshold_pct,
    )


def paired_ratio_ci(
    baseline: Sequence[float],
    samples: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    threshold_pct: float = NOISE_THRESHOLD_PCT,
) -> RatioInterval | None:
    """The overhead of ``samples`` over ``baseline`` in % from paired rounds: round ``i``
    timed ``samples[i]`` and ``baseline[i]`` back to back in one process (in rotating
    order), so a load burst hits both alike and cancels in their ratio. The estimate is
    the median of the per-round ratios, the 95% CI a bootstrap over rounds (Efron &
    Tibshirani 1993, ch. 13; rounds resampled whole, so the pairing is kept).

    Args:
        baseline, samples: per-round timings, same unit and length (extra items of the
            longer one are ignored).
        resamples: bootstrap resamples (default :data:`BOOTSTRAP_RESAMPLES`).
        threshold_pct: noise threshold of :attr:`RatioInterval.measurable`.

    Returns:
        The interval, or None without a round whose baseline time is positive.
    """
    ratios = [s / b for b, s in zip(baseline, samples, strict=False) if b > 0]
    if not ratios:
        return None
    boot = sorted(100.0 * (m - 1.0) for m in _resampled_medians(ratios, random.Random(_SEED), resamples))
    alpha = (1 - CONFIDENCE) / 2
    return RatioInterval(
        estimate_pct=100.0 * (statistics.median(ratios) - 1.0),
        low_pct=_percentile(boot, alpha),
        high_pct=_percentile(boot, 1 - alpha),
        threshold_pct=threshold_pct,
    )
