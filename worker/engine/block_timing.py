"""What recomputing each block of a chain costs, timed as the paired timing pass times a
step (issue 31): repeated, interleaved, without the memory tracker, on the timing pass's
threads and clock.

The planner's former per-block times came from one profile step run under the exact
live-tensor tracker (every op intercepted): 2-21x the recomputation a checkpoint really
adds (issue 31's GPT-2: 1,063 ms predicted, 57 ms measured extra per step). Here, on a
copy of the model outside the tracker:

1. one un-timed training step with a forward pre-hook on every block keeps each block's
   inputs (positional and keyword, detached, with their ``requires_grad``): what a
   checkpoint keeps and recomputes from;
2. ``rounds`` rounds, each one un-checkpointed training step
   (:func:`ckptlab.worker.engine.step.timed_step`: the very step the paired timing pass
   times, micro-batches and optimizer included) and, for every block in turn, its forward
   and backward alone from its kept inputs twice: as the un-checkpointed step runs it
   (``P``) and through ``torch.utils.checkpoint.checkpoint`` with the run's
   ``use_reentrant``, ``preserve_rng_state`` and autocast (``C``), timing inside the
   latter the block's forward (``F``) and its recomputation during backward (``R``: a
   non-reentrant checkpoint stops recomputing after the last tensor the block saves,
   PyTorch ``torch.utils.checkpoint`` docs; the built-in transformer's block skips its
   last 20% there, a GPT-2 block nothing). The step and the blocks, the plain and the
   checkpointed run, alternate which goes first;
3. on the clock the paired overhead is computed with
   (:meth:`ckptlab.summary.RunSummary.paired_rounds`): process CPU time on CPU
   (``time.process_time``, on ``timing_cpu_threads`` torch threads, default 1), wall time
   on CUDA (``time.perf_counter`` after ``torch.cuda.synchronize``; ``F`` and ``R`` between
   CUDA events, with no synchronize inside the checkpointed run).

What block ``i`` adds to a step when checkpointed (ms): as the last block of a segment
``C - P`` (its early-stopped recomputation, and the checkpoint's own costs: the hooks that
pack and unpack every saved tensor, the RNG state, the recomputation's set-up, about 1 ms
a block beyond ``R`` on the built-in transformer, 20% of it, measured); inside a segment
``F + (C - P) - R`` (its whole forward instead of the early-stopped part). A reentrant
checkpoint has no early stop: ``C - P`` both. Blocks that are the same computation
(module type, parameter shapes and dtypes, shapes of their inputs) share one estimate:
their samples are pooled, and a block's time is its group's median
(:meth:`ChainTimes.forward_ms`, :meth:`ChainTimes.last_ms`). A plan's predicted overhead is
what its segments add over the un-checkpointed step (as
:func:`ckptlab.planning.chain.recompute_ms` counts it), round by round, the median over
rounds with a bootstrap 95% interval (:meth:`ChainTimes.overhead`): the same statistic as
the measured paired overhead (:func:`ckptlab.analysis.stats.paired_ratio_ci`), so the two
compare directly.

Known limitations:
    - What a busy host does to the two runs' caches is not modelled; the measured overhead
      itself moves by a few points between runs of the same plan. (Fresh pages faulted in
      each step made a lower peak look cheaper, by up to a third of DenseNet's step, until
      runs kept freed memory: :mod:`ckptlab.worker.measure.heap`; docs/benchmarks.md,
      "Predicted against measured overhead".)
    - Each round costs about 2.5 un-checkpointed steps (the step, and every block's forward
      and backward twice): 7 rounds with the warm-up, 2-3 s on the benchmark's models on a
      quiet host, 4-11 s of wall time beside two busy loops on 2 cores.

Example usage::

    times = time_chain(spec, dev, built, optimizer)
    times.forward_ms(), times.last_ms()   # per block, ms: the planner's recomputation times
    times.overhead([Segment(0, 2, True), Segment(2, 4, False)]).estimate  # 0.23: +23% of a step
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from ckptlab.analysis.stats import describe
from ckptlab.planning.chain import Segment
from ckptlab.settings import get_settings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.worker.engine.blocks.inputs import Inputs, capture_inputs, group_blocks, threads
from ckptlab.worker.engine.step import timed_step
from ckptlab.worker.engine.strategies import first_tensor, selective_context
from ckptlab.worker.engine.training import autocast_for
from ckptlab.worker.measure.heap import keep_freed_heap
from ckptlab.worker.models.base import Built

__all__ = ["TIMING_ROUNDS", "Overhead", "ChainTimes", "time_chain", "CPU_CLOCK", "WALL_CLOCK"]

#: Timed rounds (one step and every block each), after one warm-up round.
TIMING_ROUNDS = 6
#: Fewest rounds, and the wall time (s) after which no further round starts once they ran.
MIN_ROUNDS, MAX_TIMING_S = 3, 30.0
#: The clocks' names, as :meth:`ckptlab.summary.RunSummary.paired_rounds` writes them.
CPU_CLOCK, WALL_CLOCK = "CPU time", "wall time"


@dataclass(frozen=True)
class Overhead:
    """A predicted step-time overhead: the recomputation a plan adds over an un-checkpointed
    step, as a fraction of that step (0.12 = +12%).

    Attributes:
        estimate: the median over rounds of (recomputation / step).
        low, high: bootstrap 95% confidence interval of that median
            (:func:`ckptlab.analysis.stats.describe`).
        q1, q3: quartiles of the per-round fractions (their spread).
        recompute_ms: what the plan adds per step at the blocks' median times, ms.
        rounds: rounds behind it.
        clock: what was timed (``"CPU time"`` or ``"wall time"``).
    """

    estimate: float
    low: float
    high: float
    q1: float
    q3: float
    recompute_ms: float
    rounds: int
    clock: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, the fractions as they are (``plan.predicted_overhead``: what
        ``backend/services/plans.py`` reads, ``{estimate, low, high}`` in fractions)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ChainTimes:
    """A chain's times, round by round (see the module docstring for how they are taken).

    Attributes:
        step_ms: the un-checkpointed training step, per round, ms (``clock``).
        block_ms: per block, what it adds to a step inside a checkpointed segment, per
            round, ms (``F + (C - P) - R``: see the module docstring).
        last_block_ms: per block, what it adds as the last block of a checkpointed segment
            (early stop), per round, ms (``C - P``).
        groups: per block, the index of the first block of its group of identical blocks.
        clock: ``"CPU time"`` (CPU) or ``"wall time"`` (CUDA).
        threads: torch threads the rounds ran on (CPU), or None (CUDA).
        micro_batches: forwards per step (``grad_accum_steps``): a plan recomputes each.
        elapsed_ms: wall time of the whole timing, warm-up included, ms.
        selective_ms: per selective policy timed, per block, what the block checkpointed
            alone under it adds to a step, per round, ms (``C_policy - P``).
    """

    step_ms: tuple[float, ...]
    block_ms: tuple[tuple[float, ...], ...]
    last_block_ms: tuple[tuple[float, ...], ...]
    groups: tuple[int, ...]
    clock: str
    threads: int | None = None
    micro_batches: int = 1
    elapsed_ms: float = 0.0
    selective_ms: dict[str, tuple[tuple[float, ...], ...]] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        """Rounds timed."""
        return len(self.step_ms)

    def _pooled(self, samples: tuple[tuple[float, ...], ...]) -> list[float]:
        """Per block, the median of its group's samples over every round and member, ms."""
        groups: dict[int, list[float]] = {}
        for g, ms in zip(self.groups, samples, strict=True):
            groups.setdefault(g, []).extend(ms)
        return [statistics.median(groups[g]) for g in self.groups]

    def forward_ms(self) -> list[float]:
        """Per block, its group's median cost inside a segment, ms (``BlockProfile.forward_ms``)."""
        return self._pooled(self.block_ms)

    def last_ms(self) -> list[float]:
        """Per block, its group's median cost as a segment's last block, ms
        (``BlockProfile.last_forward_ms``)."""
        return self._pooled(self.last_block_ms)

    def policy_ms(self, policy: str) -> list[float]:
        """Per block, its group's median cost checkpointed alone under ``policy``, ms
        (:attr:`ckptlab.planning.chain.SelectiveProfile.ms`).

        Raises:
            KeyError: ``policy`` was not timed.
        """
        return self._pooled(self.selective_ms[policy])

    def _round_ms(self, samples: tuple[tuple[float, ...], ...], block: int, r: int) -> float:
        """The median of ``samples`` of ``block``'s group in round ``r``, ms."""
        group = self.groups[block]
        return statistics.median(samples[i][r] for i, g in enumerate(self.groups) if g == group)

    def _recompute_ms(self, segments: Sequence[Segment], r: int | None) -> float:
        """What ``segments`` recompute per step, ms: in round ``r``, or at the medians (None)."""

        def at(samples: tuple[tuple[float, ...], ...]) -> list[float]:
            n = len(self.groups)
            return self._pooled(samples) if r is None else [self._round_ms(samples, i, r) for i in range(n)]

        forward, last = at(self.block_ms), at(self.last_block_ms)
        chosen = {p: at(self.selective_ms[p]) for p in {s.policy for s in segments if s.policy is not None}}
        per_micro = sum(
            chosen[s.policy][s.start] if s.policy is not None else sum(forward[s.start : s.end - 1]) + last[s.end - 1]
            for s in segments
            if s.checkpointed
        )
        return self.micro_batches * per_micro

    def overhead(self, segments: Sequence[Segment]) -> Overhead:
        """The predicted overhead of a plan (the chain's ``segments``): per round, what its
        checkpointed segments add per step (each segment's blocks inside it, its last
        block as the last: see the module docstring; ``micro_batches`` times) over the
        step's time; the median over rounds with its bootstrap 95% interval and quartiles.

        Raises:
            IndexError: a segment outside the chain.
            KeyError: a selective segment's policy was not timed.
        """
        if not any(s.checkpointed for s in segments):
            return Overhead(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, self.rounds, self.clock)
        fractions = [self._recompute_ms(segments, r) / step for r, step in enumerate(self.step_ms) if step > 0]
        spread = describe(fractions)
        assert spread is not None  # every step takes time
        return Overhead(
            spread.median,
            spread.ci_low,
            spread.ci_high,
            spread.q1,
            spread.q3,
            self._recompute_ms(segments, None),
            spread.n,
            self.clock,
        )

    def public(self) -> dict[str, Any]:
        """The run summary's ``plan.timing``: rounds, clock, threads, the step's median and
        quartiles and each block's (forward, ``last``: as a segment's last block, and
        ``selective_ms``: under each selective policy timed), ms, each block's group, and the
        time the timing took."""

        def quartiles(samples: Sequence[float]) -> dict[str, float] | None:
            s = describe(samples)
            return {"median": s.median, "q1": s.q1, "q3": s.q3} if s is not None else None

        return {
            "rounds": self.rounds,
            "clock": self.clock,
            "threads": self.threads,
            "micro_batches": self.micro_batches,
            "step_ms": quartiles(self.step_ms),
            "blocks": [
                {
                    "group": g,
                    "forward_ms": quartiles(f),
                    "last_ms": quartiles(last),
                    **(
                        {"selective_ms": {p: quartiles(ms[i]) for p, ms in self.selective_ms.items()}}
                        if self.selective_ms
                        else {}
                    ),
                }
                for i, (g, f, last) in enumerate(zip(self.groups, self.block_ms, self.last_block_ms, strict=True))
            ],
            "elapsed_ms": self.elapsed_ms,
        }


@dataclass
class _Stepper:
    """What :func:`ckptlab.worker.engine.step.timed_step` needs of a run (its
    ``StepContext``), for the model being timed."""

    spec: ExperimentSpec
    dev: torch.device
    built: Built
    opt: torch.optim.Optimizer
    autocast: Callable[[], Any]
    scaler: torch.amp.GradScaler | None = None
    gen: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    where: dict[str, Any] = field(default_factory=lambda: {"step": 1, "phase": None})
    fake: None = None
    meter: None = None
    params: list[torch.nn.Parameter] = field(default_factory=list)


class _Rounds:
    """The timing's steps: capture the blocks' inputs, then time steps and block forwards."""

    def __init__(self, stepper: _Stepper):
        self.stepper, self.cuda = stepper, stepper.dev.type == "cuda"
        self.blocks = list(stepper.built.blocks)
        self.inputs: list[Inputs] = []

    def capture(self) -> None:
        """One step with a pre-hook on every block keeping its inputs (the warm-up step)."""
        self.inputs = capture_inputs(self.blocks, lambda: timed_step(self.stepper))

    def step_ms(self) -> float:
        """One un-checkpointed training step, ms (CPU time on CPU, wall time on CUDA)."""
        record = timed_step(self.stepper)
        return record["step_ms"] if self.cuda else record["extra"]["cpu_ms"]

    def block_ms(
        self, i: int, plain_first: bool = True, policies: Sequence[str] = ()
    ) -> tuple[float, float, list[float]]:
        """What block ``i`` adds to a step when checkpointed, ms: ``(inside, last, selective)``,
        as a block inside a segment, as a segment's last block (see :meth:`_checkpointed`)
        and alone under each of ``policies`` (a selective checkpoint, less the plain run)."""
        if plain_first:
            plain = self._plain(i)
        (total, forward, recompute), *chosen = [self._checkpointed(i, p) for p in (None, *policies)]
        if not plain_first:
            plain = self._plain(i)
        extra = max(total - plain, 0.0)  # recomputation, hooks, RNG state; noise can't make it < 0
        selective = [max(t - plain, 0.0) for t, _, _ in chosen]
        if self.stepper.spec.checkpoint.use_reentrant:  # no early stop, a forward without grad
            return extra, extra, selective
        return max(forward + extra - recompute, 0.0), extra, selective

    def _run(self, i: int, fn: Callable[..., Any]) -> float:
        """``fn(*inputs)`` of block ``i`` under grad and the run's autocast, then a backward
        from its first output (a gradient of ones); the time of both, ms."""
        args, kwargs = self.inputs[i]
        self._sync()
        t0 = self._clock()
        with torch.enable_grad(), self.stepper.autocast():
            out = fn(*args, **kwargs)
        hidden = first_tensor(out)
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.backward(torch.ones_like(hidden))
        self._sync()
        elapsed = (self._clock() - t0) * 1e3
        for t in [*self.blocks[i].parameters(), *tree_leaves((args, kwargs))]:
            if isinstance(t, torch.Tensor):
                t.grad = None
        del out, hidden
        return elapsed

    def _plain(self, i: int) -> float:
        """Block ``i`` forward and backward as the un-checkpointed step runs it, ms."""
        return self._run(i, self.blocks[i])

    def _checkpointed(self, i: int, policy: str | None = None) -> tuple[float, float, float]:
        """Block ``i`` forward and backward through ``torch.utils.checkpoint.checkpoint``
        (the run's ``use_reentrant`` and ``preserve_rng_state``; with ``policy``, non-reentrant
        under that selective policy's ``context_fn``), ms: the total, the block's
        forward and its recomputation during backward, timed inside (a non-reentrant
        checkpoint's recomputation stops after the last tensor the block saves: the
        exception that stops it passes through the timer)."""
        block, ck = self.blocks[i], self.stepper.spec.checkpoint
        runs: list[Callable[[], float]] = []

        def timed(*a: Any, **kw: Any) -> Any:
            start = self._mark()
            try:
                return block(*a, **kw)
            finally:
                runs.append(self._since(start))

        def checkpointed(*a: Any, **kw: Any) -> Any:
            extra = {"context_fn": selective_context(policy)} if policy is not None else {}
            reentrant, rng = ck.use_reentrant and policy is None, ck.preserve_rng_state
            return checkpoint(timed, *a, use_reentrant=reentrant, preserve_rng_state=rng, **extra, **kw)

        total = self._run(i, checkpointed)  # ends synchronized: the CUDA events can be read
        return total, runs[0](), runs[-1]()

    def _clock(self) -> float:
        return time.perf_counter() if self.cuda else time.process_time()

    def _mark(self) -> Any:
        """Now: a recorded CUDA event on CUDA (a synchronize inside a timed run stalls the queue
        a step keeps full: twice the paired overhead on an H200, issue 31), else the clock."""
        if not self.cuda:
            return self._clock()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _since(self, start: Any) -> Callable[[], float]:
        """ms from ``start`` (:meth:`_mark`) to now, to read once the device is synchronized."""
        end = self._mark()
        return (lambda: start.elapsed_time(end)) if self.cuda else (lambda: (end - start) * 1e3)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.stepper.dev)


def time_chain(
    spec: ExperimentSpec,
    dev: torch.device,
    built: Built,
    optimizer: torch.optim.Optimizer,
    *,
    rounds: int = TIMING_ROUNDS,
    max_s: float = MAX_TIMING_S,
    policies: Sequence[str] = (),
) -> ChainTimes:
    """Time ``built`` (an un-checkpointed model, trained by ``optimizer``) and its blocks
    (see the module docstring): one warm-up round, then ``rounds`` rounds, fewer when
    :data:`MIN_ROUNDS` have run and ``max_s`` seconds have passed. The model trains on
    (its weights change); the global RNG state is restored afterwards. ``policies``: the
    selective policies to time every block under too (:attr:`ChainTimes.selective_ms`; a
    round then costs one more block forward and backward per policy).

    Raises:
        ValueError: a block did not run in the model's forward.
    """
    t0 = time.perf_counter()
    keep_freed_heap()  # the heap the run is timed on (a prediction's timing runs outside one)
    cuda = dev.type == "cuda"
    scaler = torch.amp.GradScaler(dev.type) if spec.amp == "fp16" else None
    stepper = _Stepper(
        spec, dev, built, optimizer, autocast_for(spec, dev), scaler, torch.Generator().manual_seed(spec.seed)
    )
    stepper.params = list(built.module.parameters())
    run = _Rounds(stepper)
    steps: list[float] = []
    n_threads = 0 if cuda else get_settings().timing_cpu_threads
    with torch.random.fork_rng(devices=[dev] if cuda else [], device_type=dev.type), threads(n_threads) as used:
        run.capture()
        groups = group_blocks(run.blocks, run.inputs)
        rows: list[list[tuple[float, ...]]] = [[] for _ in groups]  # per block, per round
        for i in range(len(run.blocks)):  # the warm-up: every block once
            run.block_ms(i, policies=policies)
        for r in range(rounds):
            if r >= MIN_ROUNDS and time.perf_counter() - t0 > max_s:
                break
            if r % 2:
                steps.append(run.step_ms())
            for i in range(len(groups)):  # every block (a group pools its members' samples)
                forward, last, selective = run.block_ms(i, plain_first=bool(r % 2), policies=policies)
                rows[i].append((forward, last, *selective))
            if not r % 2:
                steps.append(run.step_ms())
    return ChainTimes(
        step_ms=tuple(steps),
        block_ms=_column(rows, 0),
        last_block_ms=_column(rows, 1),
        groups=groups,
        clock=WALL_CLOCK if cuda else CPU_CLOCK,
        threads=None if cuda else used,
        micro_batches=spec.grad_accum_steps,
        elapsed_ms=(time.perf_counter() - t0) * 1e3,
        selective_ms={p: _column(rows, 2 + k) for k, p in enumerate(policies)},
    )


def _column(rows: list[list[tuple[float, ...]]], k: int) -> tuple[tuple[float, ...], ...]:
    """Per block, item ``k`` of each round's times, ms."""
    return tuple(tuple(times[k] for times in per_block) for per_block in rows)
