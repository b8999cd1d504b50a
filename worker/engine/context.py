"""One run's objects and passes: the model, its optimizer, the AMP scaler and autocast,
the data generator and the step records, with the memory pass, the timed pass and the
summary (see :mod:`ckptlab.worker.engine.run` for what is measured and how)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ckptlab.analysis.progress import PASS_STEP_MS, STEPS_PLANNED, StepTimes, steps_planned
from ckptlab.domain import MemoryCategory
from ckptlab.settings import get_settings
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import BASELINE, Strategy, get_strategy
from ckptlab.worker.engine.block_profile import BlockRecorder
from ckptlab.worker.engine.step import instrumented_step, timed_step
from ckptlab.worker.engine.timeline import TimelineKeeper
from ckptlab.worker.engine.training import FakeRun, autocast_for, build_checkpointed, make_optimizer
from ckptlab.worker.measure.meter import Meter, memory_is_flat, tag_optimizer_state
from ckptlab.worker.models.base import Built

__all__ = ["RunContext", "Sharding", "StepCallback"]

StepCallback = Callable[[dict[str, Any]], None]


class Sharding(Protocol):
    """What a sharded run's rank does to the model once its blocks are checkpointed
    (:class:`ckptlab.worker.distributed.shard.Rank`)."""

    rank: int

    def wrap(self, built: Built, blocks: list[torch.nn.Module], meter: Meter) -> Built:
        """``built`` wrapped for the rank; ``blocks``: the blocks as built, before checkpointing."""
        ...

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (a collective: every rank calls it)."""
        ...


class RunContext:
    """The per-run objects of one experiment in one place: the spec, the device, the meter,
    the model, its optimizer, the AMP scaler and autocast, the data generator, where the
    run is (``where``: phase and step, for out-of-memory reports), the step callback and
    the records of both passes.

    ``build`` makes the model and optimizer (inside the meter's tracking mode);
    ``memory_pass`` and ``timed_pass`` run the steps (:mod:`ckptlab.worker.engine.step`);
    :func:`ckptlab.worker.engine.summarize.summarize` turns the records into the summary.

    Args:
        spec: the run's spec.
        strategy: its strategy, resolved once from ``spec.checkpoint.strategy``.
        dev: the device.
        meter: the run's meter (memory and time readings).
        where: the phase and step the run is in, updated as it goes.
        on_step: called with each step's record.
        fake: the switches of a run on fake tensors (a prediction,
            :class:`ckptlab.worker.engine.training.FakeRun`); None for a real run.
        rank: this process's place in a sharded run (a :class:`Sharding`: it wraps the
            model); None for one process.
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        strategy: Strategy,
        dev: torch.device,
        meter: Meter,
        where: dict[str, Any],
        on_step: StepCallback | None,
        fake: FakeRun | None = None,
        rank: Sharding | None = None,
    ):
        self.spec, self.strategy, self.dev, self.meter = spec, strategy, dev, meter
        self.where, self.on_step, self.fake, self.rank = where, on_step, fake, rank
        self.autocast = autocast_for(spec, dev)
        self.scaler = torch.amp.GradScaler(dev.type) if spec.amp == "fp16" else None
        self.gen = torch.Generator().manual_seed(spec.seed)
        self.records: list[dict[str, Any]] = []
        self.timed: list[dict[str, Any]] = []
        self.block_profile: list[dict[str, Any]] | None = None
        self.compile_ms: float | None = None
        self.paired: list[dict[str, Any]] = []  # the un-checkpointed copy's timed steps, round by round
        self.pairing_skipped: str | None = None
        self.timing_threads: int | None = None  # torch threads of the timing pass (CPU)
        #: The memory timelines kept (:class:`TimelineKeeper`): ``(timeline, is_peak)``.
        self.timelines: list[tuple[Any, bool]] = []
        self.peak_snapshot: bytes | None = None  #: CUDA, memory_snapshot: TimelineKeeper.peak_snapshot
        self._build: Callable[[], Built] | None = None

    def build(self, build: Callable[[], Built] | None, ranges: list[tuple[int, int]] | None = None) -> None:
        """The checkpointed model (``build()``'s copy, or the spec's) and its optimizer, each
        tensor tagged with its memory category as it is made."""
        meter = self.meter
        self._build = build
        meter.set_category(MemoryCategory.PARAMETERS)
        fake = self.fake
        blocks: list[torch.nn.Module] = []
        self.built = build_checkpointed(
            self.spec,
            self.dev,
            on_recompute=meter.on_recompute,
            build=build,
            ranges=ranges,
            fake=fake is not None,
            blocks_as_built=blocks,
        )
        if self.rank is not None:
            self.built = self.rank.wrap(self.built, blocks, meter)
        self.params = list(self.built.module.parameters())
        meter.retag(list(self.params) + list(self.built.module.buffers()), MemoryCategory.PARAMETERS)
        meter.set_category(MemoryCategory.OTHER)
        self.opt = make_optimizer(self.spec, self.params, foreach=fake.foreach if fake else None)
        tag_optimizer_state(self.opt, meter)
        for p in self.params:
            p.register_post_accumulate_grad_hook(lambda q: meter.retag([q.grad], MemoryCategory.GRADIENTS))
        if self.strategy.compiles:
            self.compile_ms = self._compile()

    def _compile(self) -> float:
        """One forward and backward on a batch of the run's shape, gradients dropped: what
        ``torch.compile`` needs to compile the forward and backward graphs, so no measured
        step includes it. The RNG and the data generator are left as they were (the run
        sees the same batches and dropout masks as any other strategy). Returns its wall
        time, ms (the summary's ``compile_ms``)."""
        spec, built = self.spec, self.built
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[self.dev] if self.dev.type == "cuda" else []):
            x, y = built.make_batch(spec.batch_size, torch.Generator().manual_seed(spec.seed))
            x, y = x.to(self.dev), y.to(self.dev)
            out, loss = built.output_and_loss(x, y, self.autocast)
            loss.backward()
            del out, loss, x, y
        for p in self.params:
            p.grad = None
        self.meter.sync()
        return (time.perf_counter() - t0) * 1e3

    def _emit(self, record: dict[str, Any]) -> None:
        if self.on_step is not None:
            self.on_step(record)

    def memory_pass(self, snapshots: bool = False) -> None:
        """Up to ``spec.steps`` instrumented steps; stops early when memory is flat. A run of
        one process (on CPU or CUDA, not compiled; or a prediction's, on fake tensors) records
        the memory timeline of the steps :class:`TimelineKeeper` wants and keeps its first and
        peak steps' (:attr:`timelines`; ``snapshots``: the peak step's CUDA allocator history)."""
        spec = self.spec
        times = StepTimes(skip=spec.warmup_steps)  # the progress estimate's step time
        keeper = TimelineKeeper.for_run(self, one_process=self.rank is None, snapshots=snapshots)
        with keeper if keeper is not None else contextlib.nullcontext():  # (its hooks off at the end)
            for step in range(1, spec.steps + 1):
                self.where["step"] = step
                with keeper.step(step) if keeper is not None else contextlib.nullcontext():
                    self.records.append(_memory_step(self, step))
                if keeper is not None:
                    keeper.keep(self.records[-1], measured=step > spec.warmup_steps)
                extra = self.records[-1]["extra"]
                extra["pass"] = "memory"
                extra[STEPS_PLANNED] = steps_planned(spec.steps, spec.timed_steps)
                _note_step_time(extra, times.add(self.records[-1]["step_ms"]))
                self._emit(self.records[-1])
                if spec.memory_early_stop and memory_is_flat(self.records, spec.warmup_steps):
                    break  # every further step would read the same bytes
        self.timelines = keeper.kept() if keeper is not None else []
        self.peak_snapshot = keeper.peak_snapshot() if keeper is not None else None

    def timed_pass(self) -> None:
        """``spec.timed_steps`` steps numbered on from the memory pass.

        Paired (:meth:`_paired_baseline`): each step is a round in which this run and an
        un-checkpointed copy of the model (same weights, its own optimizer and data) each
        take one optimizer step back to back, in alternating order, without memory
        instrumentation; the copy's step times go to ``paired_baseline_step_times_ms``
        (issue 19: a load burst then hits both sides of a round alike). Unpaired: the
        steps are instrumented on CUDA (free there) and wall times only on CPU.

        On CPU the pass runs on ``timing_cpu_threads`` torch threads (setting, default 1:
        steady step times on a busy host; ``timing_threads`` in the summary)."""
        threads = 0 if self.meter.cuda else get_settings().timing_cpu_threads
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            self.timing_threads = torch.get_num_threads()
            self._timed_rounds()
        finally:
            torch.set_num_threads(before)

    def _timed_rounds(self) -> None:
        first = len(self.records) + 1
        base = self._paired_baseline()
        times = StepTimes()  # a paired step's time is its round's: both steps
        for i, step in enumerate(range(first, first + self.spec.timed_steps)):
            self.where["step"] = step
            if base is not None:
                if i % 2:
                    other, mine = timed_step(base), timed_step(self)
                else:
                    mine, other = timed_step(self), timed_step(base)
                self.timed.append(mine)
                self.paired.append(other)
            elif self.meter.cuda:
                self.timed.append(instrumented_step(self))
                self.timed[-1]["extra"]["pass"] = "timed"
            else:
                self.timed.append(timed_step(self))
            self.timed[-1]["extra"][STEPS_PLANNED] = steps_planned(first - 1, self.spec.timed_steps)
            round_ms = self.timed[-1]["step_ms"] + (self.paired[-1]["step_ms"] if base is not None else 0.0)
            _note_step_time(self.timed[-1]["extra"], times.add(round_ms))
            self._emit(self.timed[-1])

    def _paired_baseline(self) -> RunContext | None:
        """The un-checkpointed copy this run's timed steps are paired with, or None: for a
        baseline run, ``spec.paired_timing`` off, no timed steps, or a copy that does not
        fit in memory (then ``pairing_skipped`` says why and the timing is unpaired). A
        compiled run is paired with the *eager* un-checkpointed copy: its overhead is
        against the step the user runs without any of this, on the footing of every eager
        plan's (``auto``'s compiled choice competes with them, issue 31); the compiler's
        own speed-up is compile_budget 1.0's overhead."""
        spec, strategy = self.spec, self.strategy
        if strategy.name == BASELINE or not spec.paired_timing or not spec.timed_steps:
            return None
        if self.rank is not None:
            self.pairing_skipped = "a sharded run is timed unpaired: its copy would need collectives of its own"
            return None
        reference = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"strategy": BASELINE})})
        base = RunContext(reference, get_strategy(BASELINE), self.dev, self.meter, self.where, None)
        try:
            base.build(self._build)
            timed_step(base)  # its warm-up: the first step of a new model is not a round
        except (MemoryError, torch.OutOfMemoryError) as exc:
            self.pairing_skipped = f"the un-checkpointed copy does not fit beside the run: {type(exc).__name__}"
            del base
            if self.meter.cuda:
                torch.cuda.empty_cache()
            return None
        return base


def _memory_step(run: RunContext, step: int) -> dict[str, Any]:
    """One instrumented step of ``run``; the baseline's first also records its blocks once:
    what each keeps and passes on (the expected curve of a segments sweep, issue 23)."""
    if step == 1 and run.strategy.name == BASELINE:
        clock = run.fake.clock if run.fake else time.perf_counter
        with BlockRecorder(run.built.blocks, run.meter, clock=clock) as recorder:
            record = instrumented_step(run)
        run.block_profile = recorder.public()
        return record
    return instrumented_step(run)


def _note_step_time(extra: dict[str, Any], ms: float | None) -> None:
    """Put the pass's recent step time (ms) on a step record's ``extra``
    (:data:`ckptlab.analysis.progress.PASS_STEP_MS`, what progress estimates from), unless
    there is none yet (the memory pass's warm-up)."""
    if ms is not None:
        extra[PASS_STEP_MS] = ms
