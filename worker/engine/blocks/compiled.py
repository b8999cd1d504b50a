"""``auto``'s compiled candidates (``checkpoint.search_compile``, issue 31 Done-when #2):
``torch.compile`` with its own activation memory budget
(``torch._functorch.config.activation_memory_budget``, the ``compile_budget`` strategy) as a
choice beside the eager plan, searched twice (:data:`SCOPES`): with the model's whole
forward and loss compiled as one function (``compile_scope`` ``step``: the partitioner then
also chooses what the head and the loss keep) and with the blocks alone (``blocks``).

The min-cut partitioner recomputes fused kernels, which no eager checkpoint can: on the
built-in transformer 4×128 (seq 256, batch 4, CPU) ``compile_budget`` 0.8 saved 12 MiB of
``none``'s 61 MiB peak for no measurable time, where ``auto``'s eager plans paid +7 to +14%
(docs/benchmarks.md, "``auto`` with selective blocks against every alternative"). Its peak
cannot be modelled from the eager profile, so each candidate is *measured*: built and run
through the memory pass exactly as a ``compile_budget`` run of the same spec is
(:class:`ckptlab.worker.engine.context.RunContext`, the CPU allocator's readings on CPU),
in the run's process, after the eager profile has freed its copy. Per scope the fraction is
found by bisection on a grid of 1/20: the largest whose measured peak fits the budget (the
partitioner's runtime falls as it may save more). Only those (one per scope) are timed:
paired with an un-checkpointed *eager* copy (every run's pairing), so their overheads
compare with the eager plan's predicted one, all against the step the user runs without
checkpointing; the lower estimate is the candidate. It is chosen when its interval's upper
end is below the eager plan's predicted overhead (a difference outside the noise), and then
the run compiles.

Example usage (what :func:`ckptlab.worker.engine.run.run_experiment` does)::

    choice = search_compiled(spec, dev, build, eager_overhead=0.14, budget_bytes=budget)
    if choice.chosen:
        run_spec = choice.run_spec(spec)

Known limitations:
    - The bisection assumes the peak does not rise as the fraction falls; pytorch#197838
      shows it can (budget 0.0 above 0.1 on an 8-layer transformer). A fraction is only
      chosen from its own measured peak, so the budget holds; a fitting fraction the
      bisection stepped over can be missed. The grid stops at 0.05 for that reason.
    - Each probe compiles (0.3-8 s a fraction here with inductor's cache warm, tens of
      seconds cold); at most :data:`MAX_PROBES` are made per scope, and two candidates
      timed.
    - Of the two scopes' candidates whose timed build fitted, the one with the lower
      estimate is taken even where their intervals overlap (either is a fitting choice;
      the eager plan is only left for a candidate measurably cheaper than it).
    - Not on fake tensors (a prediction), nor in a sharded run (the spec refuses it).
    - Searched only once an eager plan exists: a budget no eager plan fits is refused as
      before (the compiler's lowest peaks lay above per_block's on every model measured).
    - Compiled dropout draws other masks than eager dropout (``fallback_random`` does not
      change that): the gradient check then differs, and the engine falls back to the eager
      plan (``why_not``) rather than report a run whose check cannot match.
    - Candidates run without ``memory_limit_bytes`` (as the profile step does); one that
      runs out of memory does not fit.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ckptlab.analysis.stats import paired_ratio_ci
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import STRATEGIES, CompileScope, get_strategy
from ckptlab.worker.engine.block_timing import TIMING_ROUNDS
from ckptlab.worker.engine.context import RunContext
from ckptlab.worker.measure.hostmem import is_out_of_memory
from ckptlab.worker.measure.meter import Meter
from ckptlab.worker.models.base import Built

__all__ = [
    "CompiledChoice",
    "CompiledProbe",
    "TimedCandidate",
    "search_compiled",
    "measured_compiled",
    "largest_fitting",
    "cheaper",
    "MAX_PROBES",
    "COMPILE",
    "SCOPES",
    "GRID",
]

#: The strategy a compiled candidate runs as (the table's one that compiles).
COMPILE = next(name for name, s in STRATEGIES.items() if s.compiles)
#: What the candidates compile, each searched apart: the whole forward and loss, then the
#: blocks. Neither peaks lower at every fraction (``step`` 8.7% lower at 0.8 on issue 31's
#: transformer, higher at 0.5 and 0.25 on the tests' 2x64 one: docs/benchmarks.md, "the
#: whole step compiled").
SCOPES = (CompileScope.STEP, CompileScope.BLOCKS)
#: Fractions searched: 1/20 apart, 0.05 to 1.0.
GRID = tuple(round(i / 20, 2) for i in range(1, 21))
#: Most probes one search makes (:func:`largest_fitting` needs at most 6 on :data:`GRID`).
MAX_PROBES = 7


@dataclass(frozen=True)
class CompiledProbe:
    """One fraction tried: its measured peak (bytes, the memory pass's maximum after
    warm-up, as the run's summary reads it; None when it ran out of memory), its
    compile time (ms; 0 when out of memory) and what it compiled."""

    fraction: float
    peak_bytes: int | None
    compile_ms: float
    scope: CompileScope = CompileScope.BLOCKS

    @property
    def out_of_memory(self) -> bool:
        """The candidate ran out of memory (no peak was measured): it does not fit."""
        return self.peak_bytes is None


@dataclass(frozen=True)
class TimedCandidate:
    """A scope's largest fitting fraction built again and timed: its peak (bytes), paired
    overhead (as :attr:`CompiledChoice.overhead`) and why it had no paired rounds, or None."""

    scope: CompileScope
    fraction: float
    peak_bytes: int
    overhead: dict[str, Any] | None
    pairing_skipped: str | None = None


@dataclass
class CompiledChoice:
    """The compiled candidate for a budget and whether ``auto`` runs it.

    Attributes:
        budget_bytes: the budget searched for.
        probes: every fraction tried, in order (each scope's bisection in turn).
        fraction: the candidate: of each scope's largest fraction found fitting, the one
            whose paired overhead is lowest (the first found when none was timed), or None
            (none fits).
        scope: what the candidate compiles, or None.
        peak_bytes: its measured peak (bytes; a second build, the timed one), or None.
        overhead: its paired overhead over the un-checkpointed eager step
            (``{estimate, low, high}``, fractions, as ``plan.predicted_overhead``; rounds,
            clock), or None.
        timed: each scope's candidate as timed (:class:`TimedCandidate`), in search order.
        errors: per scope whose search raised (not for running out of memory), what
            ``why_not`` would say.
        eager_overhead: the eager plan's predicted overhead it was compared with (fraction).
        chosen: whether the run compiles (the upper end of ``overhead`` below
            ``eager_overhead``).
        why_not: why a candidate found was not run when its time does not say (its
            gradients, its timed build's peak, no paired rounds, no eager prediction, or
            torch.compile failing), or None.
        pairing_skipped: why its timed build had no paired rounds (the eager copy did
            not fit beside it), or None.
    """

    budget_bytes: int
    probes: list[CompiledProbe] = field(default_factory=list)
    fraction: float | None = None
    scope: CompileScope | None = None
    peak_bytes: int | None = None
    overhead: dict[str, Any] | None = None
    timed: list[TimedCandidate] = field(default_factory=list)
    errors: dict[CompileScope, str] = field(default_factory=dict)
    eager_overhead: float | None = None
    chosen: bool = False
    why_not: str | None = None
    pairing_skipped: str | None = None

    def run_spec(self, spec: ExperimentSpec) -> ExperimentSpec:
        """``spec`` as the ``compile_budget`` run of the chosen fraction and scope.

        Raises:
            ValueError: no fraction was found.
        """
        if self.fraction is None or self.scope is None:
            raise ValueError("no compiled candidate fits the budget")
        return compiled_spec(spec, self.fraction, self.scope)

    def public(self) -> dict[str, Any]:
        """JSON-able: the summary's ``plan.compiled``."""
        return {
            "budget_bytes": self.budget_bytes,
            "activation_memory_budget": self.fraction,
            "compile_scope": self.scope.value if self.scope is not None else None,
            "peak_bytes": self.peak_bytes,
            "predicted_overhead": self.overhead,
            "eager_overhead": self.eager_overhead,
            "chosen": self.chosen,
            "why_not": self.why_not,
            "probes": [
                {
                    "activation_memory_budget": p.fraction,
                    "compile_scope": p.scope.value,
                    "peak_bytes": p.peak_bytes,
                    "compile_ms": p.compile_ms,
                    "out_of_memory": p.out_of_memory,
                }
                for p in self.probes
            ],
            "candidates": [
                {
                    "compile_scope": c.scope.value,
                    "activation_memory_budget": c.fraction,
                    "peak_bytes": c.peak_bytes,
                    "predicted_overhead": c.overhead,
                }
                for c in self.timed
            ],
            "errors": {scope.value: words for scope, words in self.errors.items()},
        }


def compiled_spec(spec: ExperimentSpec, fraction: float, scope: CompileScope, **update: Any) -> ExperimentSpec:
    """``spec`` as strategy ``compile_budget`` at ``fraction`` compiling ``scope`` (and
    ``update``'s fields)."""
    ck = spec.checkpoint.model_copy(
        update={
            "strategy": COMPILE,
            "activation_memory_budget": fraction,
            "compile_scope": scope,
            "search_compile": False,
        }
    )
    return spec.model_copy(update={"checkpoint": ck, **update})


def search_compiled(
    spec: ExperimentSpec,
    dev: torch.device,
    build: Callable[[], Built] | None,
    *,
    eager_overhead: float | None,
    budget_bytes: int,
) -> CompiledChoice:
    """Per scope (:data:`SCOPES`), bisect :data:`GRID` for the largest fraction whose
    measured peak is at most ``budget_bytes`` and time it paired against the eager
    un-checkpointed step; take the one with the lower overhead, and choose it over the
    eager plan (predicted overhead ``eager_overhead``, a fraction; None: not timed)
    when its interval lies below (:func:`cheaper`). A candidate that runs out of memory
    does not fit (its probe says ``out_of_memory``, with no peak).

    A scope torch.compile cannot run (a compile error, anything the compiled run raises
    but running out of memory) gives no candidate: its search ends there (``errors``),
    the other scope's goes on; with no candidate at all the eager plan runs and
    ``why_not`` gives the first error's first line. Nothing is raised.
    """
    choice = CompiledChoice(budget_bytes=budget_bytes, eager_overhead=eager_overhead)
    try:
        for scope in SCOPES:
            try:
                fraction = _bisect(choice, spec, dev, build, scope)
                if fraction is not None:
                    choice.timed.append(_timed(spec, dev, build, fraction, scope))
            except Exception as exc:  # noqa: BLE001 - the other scope, or the eager plan, is still there to run
                line = (str(exc).strip().splitlines() or [""])[0][:200]
                oom = isinstance(exc, torch.OutOfMemoryError) or is_out_of_memory(exc)
                what = "ran out of memory timing it" if oom else "could not run it"
                choice.errors[scope] = f"torch.compile {what}: {type(exc).__name__}: {line}"
        _pick(choice)
        if choice.fraction is None and choice.errors:
            choice.why_not = next(iter(choice.errors.values()))
    finally:
        torch._dynamo.reset()  # nothing the candidates compiled outlives the search
        gc.collect()
        if dev.type == "cuda":  # what the candidates left cached is not the run's
            torch.cuda.empty_cache()
    fits = choice.peak_bytes is not None and choice.peak_bytes <= budget_bytes
    choice.chosen = fits and cheaper(choice.overhead, eager_overhead)
    if choice.peak_bytes is not None and not choice.chosen and choice.why_not is None:
        choice.why_not = _not_compared(choice, eager_overhead, fits)
    return choice


def _not_compared(choice: CompiledChoice, eager_overhead: float | None, fits: bool) -> str | None:
    """Why a candidate found fitting was not run when that is not its time (None: it was
    timed and not measurably cheaper, which the page says on its own)."""
    if not fits:
        return f"its timed build peaked at {choice.peak_bytes:,} B, over the budget"
    if choice.overhead is None:
        return f"it could not be timed beside the eager copy ({choice.pairing_skipped or 'no paired rounds'})"
    if eager_overhead is None:
        return "the eager plan's overhead was not predicted: nothing to beat"
    return None


def _bisect(
    choice: CompiledChoice,
    spec: ExperimentSpec,
    dev: torch.device,
    build: Callable[[], Built] | None,
    scope: CompileScope,
) -> float | None:
    """The largest fraction of :data:`GRID` whose measured peak compiling ``scope`` fits
    ``choice.budget_bytes`` (None: none found), each probe appended to ``choice.probes``.

    Raises:
        Whatever a probe raises but running out of memory (a probe that does is no fit).
    """
    peaks: dict[float, int | None] = {}  # None: out of memory

    def fits(k: int) -> bool:
        fraction = GRID[k]
        if fraction not in peaks:
            try:
                run = measured_compiled(spec, dev, build, fraction, scope, timed=False)
                peaks[fraction], compile_ms = _peak(run), run.compile_ms or 0.0
            except Exception as exc:  # noqa: BLE001 - out of memory: it does not fit, the next may
                if not (isinstance(exc, torch.OutOfMemoryError) or is_out_of_memory(exc)):
                    raise  # (the simulated one is a MemoryError, the host's a RuntimeError)
                peaks[fraction], compile_ms = None, 0.0
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            choice.probes.append(CompiledProbe(fraction, peaks[fraction], compile_ms, scope))
        peak = peaks[fraction]
        return peak is not None and peak <= choice.budget_bytes

    k = largest_fitting(fits, len(GRID))
    return None if k is None else GRID[k]


def _timed(
    spec: ExperimentSpec, dev: torch.device, build: Callable[[], Built] | None, fraction: float, scope: CompileScope
) -> TimedCandidate:
    """``fraction`` compiling ``scope`` built again and timed paired with the eager
    un-checkpointed step; only its figures are kept (on CUDA a second candidate's absolute
    peak must not hold this one's model).

    Raises:
        Whatever the run raises (``torch.OutOfMemoryError`` included).
    """
    if dev.type == "cuda":  # what the earlier candidates cached is not this one's
        torch.cuda.empty_cache()
    run = measured_compiled(spec, dev, build, fraction, scope, timed=True)
    clock = "step_ms" if dev.type == "cuda" else "cpu_ms"
    mine = [r["step_ms"] if clock == "step_ms" else r["extra"]["cpu_ms"] for r in run.timed]
    base = [r["step_ms"] if clock == "step_ms" else r["extra"]["cpu_ms"] for r in run.paired]
    interval = paired_ratio_ci(base, mine)
    overhead = None
    if interval is not None:
        overhead = {
            "estimate": interval.estimate_pct / 100,
            "low": interval.low_pct / 100,
            "high": interval.high_pct / 100,
            "rounds": interval.rounds,
            "clock": "wall time" if clock == "step_ms" else "CPU time",
        }
    return TimedCandidate(scope, fraction, _peak(run), overhead, run.pairing_skipped)


def _pick(choice: CompiledChoice) -> None:
    """Of ``choice.timed``, the candidate: a timed build that fitted the budget first, a
    timed one before an untimed one, then the lowest estimate (the first found on ties)."""
    if not choice.timed:
        return
    budget = choice.budget_bytes

    def key(j: int) -> tuple:
        c = choice.timed[j]
        return (c.peak_bytes > budget, c.overhead is None, c.overhead["estimate"] if c.overhead else 0.0, j)

    c = choice.timed[min(range(len(choice.timed)), key=key)]
    choice.scope, choice.fraction, choice.peak_bytes = c.scope, c.fraction, c.peak_bytes
    choice.overhead, choice.pairing_skipped = c.overhead, c.pairing_skipped


def cheaper(overhead: dict[str, Any] | None, eager_overhead: float | None) -> bool:
    """Whether a compiled candidate's measured overhead (``{estimate, low, high}``,
    fractions of the eager un-checkpointed step) beats the eager plan's predicted one
    (a fraction) outside the noise: its interval's upper end lies below. With no eager
    prediction (the blocks could not be timed) nothing says it is cheaper: the eager plan,
    whose peak is exact, stays."""
    if eager_overhead is None or overhead is None:
        return False
    return overhead["high"] < eager_overhead


def largest_fitting(fits: Callable[[int], bool], n: int, max_probes: int = MAX_PROBES) -> int | None:
    """The largest ``k`` in ``range(n)`` with ``fits(k)``, by bisection (``fits`` assumed to
    hold up to some ``k`` and fail above it), the top first; None when none fits or the
    probes ran out before one fitting was found. Calls ``fits`` at most ``max_probes``
    times (1 + ceil(log2(n)) needed)."""
    calls = 0

    def probe(k: int) -> bool:
        nonlocal calls
        calls += 1
        return fits(k)

    if probe(n - 1):
        return n - 1
    lo, hi = -1, n - 2  # lo fits (-1: none known yet); above hi none does
    while lo < hi and calls < max_probes:
        mid = (lo + hi + 1) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo if lo >= 0 else None


def _peak(run: RunContext) -> int:
    """The memory pass's peak as the summary reads it (max after warm-up), bytes."""
    measured = run.records[run.spec.warmup_steps :] or run.records
    return max(r["peak_allocated_bytes"] for r in measured)


def measured_compiled(
    spec: ExperimentSpec,
    dev: torch.device,
    build: Callable[[], Built] | None,
    fraction: float,
    scope: CompileScope = CompileScope.BLOCKS,
    *,
    timed: bool,
    timed_steps: int = 4 * TIMING_ROUNDS,
) -> RunContext:
    """A ``compile_budget`` run of ``spec`` at ``fraction`` compiling ``scope`` through its
    memory pass (as :func:`ckptlab.worker.engine.run.run_experiment` sets one up: dynamo's
    caches freed first, the allocator's readings on CPU), then, if ``timed``,
    ``timed_steps`` (24: with 12, intervals 20-30 points wide flipped the choice from run to
    run on a host whose step times moved up to 2x) timed steps paired with an eager
    un-checkpointed copy (``run.timed``, ``run.paired``). RNG state restored after.

    Raises:
        Whatever the run raises (a compile error, ``torch.OutOfMemoryError``).
    """
    cspec = compiled_spec(
        spec,
        fraction,
        scope,
        timed_steps=timed_steps if timed else 0,
        paired_timing=True,
        verify_gradients=False,
        memory_snapshot=False,
    )
    torch._dynamo.reset()
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    meter = Meter(dev, None, allocator_events=dev.type == "cpu")  # no limit, as the profile step
    run = RunContext(cspec, get_strategy(COMPILE), dev, meter, {"phase": "setup", "step": 0}, None)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        with meter.mode():
            run.build(build)
            run.memory_pass()
            if timed and meter.cuda:
                run.timed_pass()
        if timed and not meter.cuda:
            meter.tracking = False
            run.timed_pass()
    return run
