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
samples always give the same interval. Each resampled median is drawn from order statistics
(:func:`_resampled_medians`: milliseconds for a 90,000-step run, where resampling took
minutes: issue 33), and intervals already computed are remembered; numpy, no torch.
"""

from __future__ import annotations

import functools
import hashlib
import statistics
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

import numpy as np

from ckptlab.domain import NOISE_THRESHOLD_PCT
from ckptlab.summary import HostLoad, PairedOverhead, RunSummary

_T = TypeVar("_T")

__all__ = [
    "Spread",
    "describe",
    "RatioInterval",
    "ratio_ci",
    "paired_ratio_ci",
    "paired_overhead_of",
    "separate_runs_not_comparable",
    "between_separate_runs",
    "MIN_ROUNDS",
    "SEPARATE_RUNS",
    "stored_paired_overhead",
    "BOOTSTRAP_RESAMPLES",
    "CONFIDENCE",
    "NOISE_THRESHOLD_PCT",
]

#: Fewest samples (rounds) behind an interval before a difference is called measurable.
MIN_ROUNDS = 5
#: The label of every raw time (ms) taken from one run and shown beside another's (tables,
#: exports): two runs' step times are not a comparison, their paired overheads are (issue 32).
SEPARATE_RUNS = "separate runs, not comparable on a busy host"
#: Other work on the host (the 1-minute load average less the run's own threads) per core,
#: at or above which a run's step times are not compared with another run's, nor when the
#: two runs' figures differ by as much: the load of two busy loops on 2 cores is 1.0. Used
#: where a run has no CPU share (CUDA).
BUSY_LOAD_PER_CORE = 0.25
#: Share of its threads' time a CPU run's timed steps must get (CPU time over wall time)
#: for its step times to be compared with another run's; two runs' shares may differ by at
#: most :data:`SHARE_MOVED`. Quiet 2-core VM: 0.97-1.0; one thread beside two busy loops: 0.6-0.7.
QUIET_CPU_SHARE = 0.85
SHARE_MOVED = 0.1

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


#: Intervals remembered (:func:`_remembered`): a read that asks again for the same samples
#: (the same runs, unchanged) gets the interval without resampling.
_MEMO_SIZE = 1024
_memo: OrderedDict[tuple, Any] = OrderedDict()
_memo_lock = threading.Lock()


def _remembered(fn: Callable[..., _T]) -> Callable[..., _T]:
    """``fn`` with its answers remembered by the content of its sample arguments (a digest
    of their values) and its keyword arguments, the least recently used first forgotten
    beyond :data:`_MEMO_SIZE`. The answers are immutable (frozen dataclasses or None)."""

    @functools.wraps(fn)
    def call(*samples: Sequence[float], **kwargs: Any) -> _T:
        digests = tuple(hashlib.blake2b(np.asarray(s, dtype=float).tobytes(), digest_size=16).digest() for s in samples)
        key = (fn.__name__, digests, tuple(sorted(kwargs.items())))
        with _memo_lock:
            if key in _memo:
                _memo.move_to_end(key)
                return _memo[key]
        value = fn(*samples, **kwargs)
        with _memo_lock:
            _memo[key] = value
            while len(_memo) > _MEMO_SIZE:
                _memo.popitem(last=False)
        return value

    return call


def _resampled_medians(samples: Sequence[float], rng: np.random.Generator, n: int) -> list[float]:
    """The medians of ``n`` bootstrap resamples of ``samples`` (drawn with replacement, each as
    long as ``samples``), drawn without drawing the resamples.

    A resample of ``k`` values is ``F^-1(U_1), ..., F^-1(U_k)`` for uniforms ``U_i`` and the
    samples' empirical quantile function ``F^-1`` (``x_(ceil(k u))`` of the sorted values),
    which is monotone: the resample's middle order statistics are ``F^-1`` of the uniforms'.
    The ``j``-th of ``k`` uniforms is Beta(j, k + 1 - j); given the ``j``-th at ``u``, the
    next is ``u + (1 - u) Beta(1, k - j)`` (David & Nagaraja, *Order Statistics*, 3rd ed.
    2003, sections 2.1-2.5). So each median costs two Beta draws: a 90,000-step run's
    interval takes milliseconds where resampling it took seconds with numpy and minutes in
    Python (issue 33), with the same
    distribution (checked against index resampling at 1 to 2,001 samples).
    """
    x = np.sort(np.asarray(samples, dtype=float))
    k = x.size

    def at(u: np.ndarray) -> np.ndarray:
        return x[np.minimum(np.floor(u * k).astype(np.int64), k - 1)]

    if k % 2:
        return at(rng.beta((k + 1) / 2, (k + 1) / 2, size=n)).tolist()
    half = k // 2
    lower = rng.beta(half, half + 1, size=n)
    upper = lower + (1 - lower) * rng.beta(1, k - half, size=n)
    return ((at(lower) + at(upper)) / 2).tolist()


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


@_remembered
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
    boot = sorted(_resampled_medians(ordered, np.random.default_rng(_SEED), resamples))
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
        rounds: samples behind it (the fewer of the two sets; paired: the rounds); None:
            not known (nothing is then refused for too few).
        not_comparable: why the two sets may not be compared, or None: separate runs timed
            while the host's load was high or moved between them
            (:func:`separate_runs_not_comparable`).
    """

    estimate_pct: float
    low_pct: float
    high_pct: float
    threshold_pct: float = NOISE_THRESHOLD_PCT
    rounds: int | None = None
    not_comparable: str | None = None

    @property
    def measurable(self) -> bool:
        """Whether there is a difference to report: the sets may be compared, there are at
        least :data:`MIN_ROUNDS` samples, the interval excludes 0 and the estimate is at least
        ``threshold_pct`` away from 0 (issue 31: under two busy loops, identical work timed
        in separate runs was called different in 4 of 5 sweeps)."""
        if self.not_comparable is not None or (self.rounds is not None and self.rounds < MIN_ROUNDS):
            return False
        excludes_zero = self.low_pct > 0 or self.high_pct < 0
        return excludes_zero and abs(self.estimate_pct) >= self.threshold_pct

    @property
    def unmeasured_why(self) -> str | None:
        """Why :attr:`measurable` is False, in words, or None when it is True: "not
        comparable", "too few rounds (3; at least 5)", "the 95% CI contains 0" or "below the
        noise threshold (±10%)" (a CI of +20% to +41% over 3 rounds must not read "no
        measurable difference" without its reason)."""
        if self.measurable:
            return None
        if self.not_comparable is not None:
            return "not comparable"
        if self.rounds is not None and self.rounds < MIN_ROUNDS:
            return f"too few rounds ({self.rounds}; at least {MIN_ROUNDS})"
        if not (self.low_pct > 0 or self.high_pct < 0):
            return "the 95% CI contains 0"
        return f"below the noise threshold (±{self.threshold_pct:g}%)"

    def as_dict(self) -> dict[str, float | bool | int | str | None]:
        """JSON-able: ``estimate_pct, low_pct, high_pct, threshold_pct, rounds,
        not_comparable, measurable, unmeasured_why``."""
        return {**asdict(self), "measurable": self.measurable, "unmeasured_why": self.unmeasured_why}


@_remembered
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
    rng = np.random.default_rng(_SEED)
    b = _resampled_medians(list(baseline), rng, resamples)
    s = _resampled_medians(list(samples), rng, resamples)
    ratios = sorted(100.0 * (sm / bm - 1.0) for sm, bm in zip(s, b, strict=True) if bm > 0)
    alpha = (1 - CONFIDENCE) / 2
    return RatioInterval(
        estimate_pct=100.0 * (statistics.median(samples) / base_median - 1.0),
        low_pct=_percentile(ratios, alpha),
        high_pct=_percentile(ratios, 1 - alpha),
        threshold_pct=threshold_pct,
        rounds=min(len(baseline), len(samples)),
    )


@_remembered
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
    boot = sorted(100.0 * (m - 1.0) for m in _resampled_medians(ratios, np.random.default_rng(_SEED), resamples))
    alpha = (1 - CONFIDENCE) / 2
    return RatioInterval(
        estimate_pct=100.0 * (statistics.median(ratios) - 1.0),
        low_pct=_percentile(boot, alpha),
        high_pct=_percentile(boot, 1 - alpha),
        threshold_pct=threshold_pct,
        rounds=len(ratios),
    )


def stored_paired_overhead(summary: RunSummary) -> PairedOverhead | None:
    """What the worker stores when a run finishes: :func:`paired_ratio_ci` of the summary's
    paired rounds (:meth:`ckptlab.summary.RunSummary.paired_rounds`), or None without them."""
    rounds = summary.paired_rounds()
    interval = paired_ratio_ci(rounds[0], rounds[1]) if rounds is not None else None
    if interval is None:
        return None
    return PairedOverhead(
        estimate_pct=interval.estimate_pct,
        low_pct=interval.low_pct,
        high_pct=interval.high_pct,
        rounds=interval.rounds,
        clock=rounds[2],
    )


def paired_overhead_of(summary: RunSummary, *, threshold_pct: float = NOISE_THRESHOLD_PCT) -> RatioInterval | None:
    """A run's overhead over its paired copy: the figures stored when it finished
    (``summary.paired_overhead``), else (a run stored before they were) computed from its
    rounds; None when its timing pass was not paired. ``threshold_pct``: the noise threshold
    of :attr:`RatioInterval.measurable`."""
    stored = summary.paired_overhead
    if stored is not None:
        return RatioInterval(
            stored.estimate_pct, stored.low_pct, stored.high_pct, threshold_pct=threshold_pct, rounds=stored.rounds
        )
    rounds = summary.paired_rounds()
    return paired_ratio_ci(rounds[0], rounds[1], threshold_pct=threshold_pct) if rounds is not None else None


def separate_runs_not_comparable(a: HostLoad | None, b: HostLoad | None) -> str | None:
    """Why step times of two separate runs may not be compared, or None when they may.

    CPU runs (both with a ``cpu_share``, :class:`ckptlab.summary.HostLoad`): when either
    timing pass got less than :data:`QUIET_CPU_SHARE` of its threads' time, or the two
    shares differ by more than :data:`SHARE_MOVED`. Otherwise by the 1-minute load average
    less the run's own threads, per core: :data:`BUSY_LOAD_PER_CORE` or more for either run,
    or a difference of as much. A difference of such runs' step times is the host's as much
    as theirs: on this 2-core VM identical work under two busy loops read -35% to +102%
    (issue 31). A run stored before loads were recorded (None) is compared as before. CPU
    runs of which one kept freed heap memory and the other did not (``heap_kept``, read
    through :meth:`ckptlab.summary.RunSummary.compared_load`; unset on both: CUDA runs, or
    two older CPU runs, compared as before) are never comparable, sharded ones included:
    page faults alone moved a DenseNet step from 69 to 99 ms (docs/benchmarks.md, bench_heap).
    """
    if a is None or b is None:
        return None
    loads = f"load averages {a.load_1m:.1f} and {b.load_1m:.1f} on {a.cpus} cores"
    recorded = a.heap_kept is not None or b.heap_kept is not None  # None: CUDA, or an older CPU run
    if recorded and bool(a.heap_kept) != bool(b.heap_kept):
        return (
            "separate runs on different CPU heaps: not comparable (one run's heap kept freed memory, "
            "the other's faulted pages in every step)"
        )
    if a.cpu_share is not None and b.cpu_share is not None:
        low, moved = min(a.cpu_share, b.cpu_share), abs(a.cpu_share - b.cpu_share)
        if low >= QUIET_CPU_SHARE and moved <= SHARE_MOVED:
            return None
        shares = f"their timed steps got {a.cpu_share:.0%} and {b.cpu_share:.0%} of their threads' time"
        return f"separate runs on a busy host: not comparable ({shares}; {loads})"
    others = [max(0.0, h.load_1m - h.threads) / h.cpus for h in (a, b)]
    if max(others) < BUSY_LOAD_PER_CORE and abs(others[0] - others[1]) < BUSY_LOAD_PER_CORE:
        return None
    return f"separate runs on a busy host: not comparable ({loads})"


def between_separate_runs(
    interval: RatioInterval | None, a: Sequence[HostLoad | None], b: Sequence[HostLoad | None]
) -> RatioInterval | None:
    """``interval``, a comparison of one side's step times with another's taken in separate
    runs (``a``, ``b``: the loads of every run pooled into each side), marked
    ``not_comparable`` when any pair of loads across the sides says so
    (:func:`separate_runs_not_comparable`); None stays None."""
    if interval is None:
        return None
    for x in a:
        for y in b:
            why = separate_runs_not_comparable(x, y)
            if why is not None:
                return replace(interval, not_comparable=why)
    return interval
