"""One run's objects and passes: the model, its optimizer, the AMP scaler and autocast,
the data generator and the step records, with the memory pass, the timed pass and the
summary (see :mod:`worker.engine` for what is measured and how)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ckptlab.domain import MemoryCategory
from ckptlab.progress import STEPS_PLANNED, steps_planned
from ckptlab.settings import get_settings
from ckptlab.spec import ExperimentSpec
from ckptlab.stats import describe
from ckptlab.strategies import BASELINE, get_strategy
from ckptlab.summary import StepRecord
from worker.block_profile import BlockRecorder
from worker.memory import CATEGORIES
from worker.meter import Meter, growth_per_step, memory_is_flat, optimizer_tensors, tag_optimizer_state
from worker.models import Built
from worker.training import autocast_for, build_checkpointed, environment, make_optimizer

__all__ = ["RunContext", "StepCallback"]

StepCallback = Callable[[dict[str, Any]], None]


def _optimizer_step(opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    """``opt.step()``, through ``scaler`` (unscale, skip on inf, update) when AMP fp16 uses one."""
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


class RunContext:
    """The per-run objects of one experiment in one place: the spec, the device, the meter,
    the model, its optimizer, the AMP scaler and autocast, the data generator, where the
    run is (``where``: phase and step, for out-of-memory reports), the step callback and
    the records of both passes.

    ``build`` makes the model and optimizer (inside the meter's tracking mode);
    ``memory_pass`` and ``timed_pass`` run the steps; ``summarize`` turns the records into
    the summary.
    """

    def __init__(
        self, spec: ExperimentSpec, dev: torch.device, meter: Meter, where: dict[str, Any], on_step: StepCallback | None
    ):
        self.spec, self.dev, self.meter, self.where, self.on_step = spec, dev, meter, where, on_step
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
        self._build: Callable[[], Built] | None = None

    def build(self, build: Callable[[], Built] | None, ranges: list[tuple[int, int]] | None = None) -> None:
        """The checkpointed model (``build()``'s copy, or the spec's) and its optimizer, each
        tensor tagged with its memory category as it is made."""
        meter = self.meter
        self._build = build
        meter.set_category(MemoryCategory.PARAMETERS)
        self.built = build_checkpointed(
            self.spec, self.dev, on_recompute=meter.on_recompute, build=build, ranges=ranges
        )
        self.params = list(self.built.module.parameters())
        meter.retag(list(self.params) + list(self.built.module.buffers()), MemoryCategory.PARAMETERS)
        meter.set_category(MemoryCategory.OTHER)
        self.opt = make_optimizer(self.spec, self.params)
        tag_optimizer_state(self.opt, meter)
        for p in self.params:
            p.register_post_accumulate_grad_hook(lambda q: meter.retag([q.grad], MemoryCategory.GRADIENTS))
        if get_strategy(self.spec.checkpoint.strategy).compiles:
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
            with self.autocast():
                out = built.module(x)
            built.loss_fn(out, y).backward()
            del out, x, y
        for p in self.params:
            p.grad = None
        self.meter.sync()
        return (time.perf_counter() - t0) * 1e3

    def _emit(self, record: dict[str, Any]) -> None:
        if self.on_step is not None:
            self.on_step(record)

    def memory_pass(self) -> None:
        """Up to ``spec.steps`` instrumented steps; stops early when memory is flat."""
        spec = self.spec
        for step in range(1, spec.steps + 1):
            self.where["step"] = step
            if step == 1 and spec.checkpoint.strategy == BASELINE:
                # The baseline's blocks, recorded once: what each keeps and passes on (the
                # expected curve of a segments sweep, issue 23).
                with BlockRecorder(self.built.blocks, self.meter) as recorder:
                    self.records.append(self._one_step())
                self.block_profile = recorder.public()
            else:
                self.records.append(self._one_step())
            self.records[-1]["extra"]["pass"] = "memory"
            self.records[-1]["extra"][STEPS_PLANNED] = steps_planned(spec.steps, spec.timed_steps)
            self._emit(self.records[-1])
            if spec.memory_early_stop and memory_is_flat(self.records, spec.warmup_steps):
                break  # every further step would read the same bytes

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
        for i, step in enumerate(range(first, first + self.spec.timed_steps)):
            self.where["step"] = step
            if base is not None:
                if i % 2:
                    other, mine = base._timed_step(), self._timed_step()
                else:
                    mine, other = self._timed_step(), base._timed_step()
                self.timed.append(mine)
                self.paired.append(other)
            elif self.meter.cuda:
                self.timed.append(self._one_step())
                self.timed[-1]["extra"]["pass"] = "timed"
            else:
                self.timed.append(self._timed_step())
            self.timed[-1]["extra"][STEPS_PLANNED] = steps_planned(first - 1, self.spec.timed_steps)
            self._emit(self.timed[-1])

    def _paired_baseline(self) -> RunContext | None:
        """The un-checkpointed copy this run's timed steps are paired with, or None: for a
        baseline run, a compiled one (its own baseline is the compiled model at budget
        1.0, a separate run), ``spec.paired_timing`` off, no timed steps, or a copy that
        does not fit in memory (then ``pairing_skipped`` says why and the timing is
        unpaired)."""
        spec = self.spec
        strategy = get_strategy(spec.checkpoint.strategy)
        if spec.checkpoint.strategy == BASELINE or strategy.compiles or not spec.paired_timing or not spec.timed_steps:
            return None
        reference = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"strategy": BASELINE})})
        base = RunContext(reference, self.dev, self.meter, self.where, None)
        try:
            base.build(self._build)
            base._timed_step()  # its warm-up: the first step of a new model is not a round
        except (MemoryError, torch.OutOfMemoryError) as exc:
            self.pairing_skipped = f"the un-checkpointed copy does not fit beside the run: {type(exc).__name__}"
            del base
            if self.meter.cuda:
                torch.cuda.empty_cache()
            return None
        return base

    def summarize(self) -> dict[str, Any]:
        """The run's summary from its records (the fields :func:`run_experiment` lists)."""
        spec, dev, records, timed = self.spec, self.dev, self.records, self.timed
        cuda = self.meter.cuda
        measured = records[spec.warmup_steps :] or records
        peak_rec = max(measured, key=lambda r: r["peak_allocated_bytes"])
        final_loss = (timed or records)[-1]["loss"]
        env = environment(dev)
        summary: dict[str, Any] = {
            "device": str(dev),
            "device_name": env["device_name"] if cuda else "cpu",
            "activation_bytes": int(_median([r["extra"]["activation_bytes"] for r in measured])),
            "rng_state_bytes": int(_median([r["extra"].get("rng_state_bytes", 0) for r in measured])),
            "peak_allocated_bytes": peak_rec["peak_allocated_bytes"],
            "recompute_peak_bytes": max(r["extra"]["recompute_peak_bytes"] for r in measured),
            **_timing(timed or measured, pass_name="timed" if timed else "memory"),
            "memory_at_peak": peak_rec["extra"]["memory_at_peak"],
            "memory_at_forward_end": measured[-1]["extra"]["memory_at_forward_end"],
            "params_without_grad": max(r["extra"]["params_without_grad"] for r in records),
            "memory_steps_run": len(records),
            "memory_steps_requested": spec.steps,
            "memory_growth_bytes_per_step": growth_per_step(measured),
            "param_count": sum(p.numel() for p in self.params),
            "final_loss": final_loss if math.isfinite(final_loss) else None,
            **_peak_facts(peak_rec),
            "environment": env,
            "torch_version": torch.__version__,
        }
        if self.block_profile is not None:
            summary["block_profile"] = self.block_profile
        summary["memory_source"] = self.meter.source
        if self.paired:
            summary["paired_with"] = BASELINE
            summary["paired_baseline_step_times_ms"] = [r["step_ms"] for r in self.paired]
            summary["paired_baseline_cpu_ms"] = [r["extra"]["cpu_ms"] for r in self.paired]
        if self.pairing_skipped:
            summary["pairing_skipped"] = self.pairing_skipped
        if timed and "cpu_ms" in timed[0]["extra"]:
            summary["step_cpu_ms"] = [r["extra"]["cpu_ms"] for r in timed]
        if self.compile_ms is not None:
            summary["compile_ms"] = self.compile_ms
        if timed and not cuda:
            summary["timing_threads"] = self.timing_threads
        if cuda:
            summary["reserved_bytes"] = max(r["reserved_bytes"] for r in records)
            used = [r["extra"]["nvml_used_bytes"] for r in records if r["extra"]["nvml_used_bytes"] is not None]
            summary["nvml_used_bytes"] = max(used) if used else None
        return summary

    def _timed_step(self) -> dict[str, Any]:
        """One optimizer step of the timing pass: times only, no memory instrumentation (its
        memory columns are None, explicitly). Wall times from ``time.perf_counter`` on CPU,
        from CUDA events on CUDA (one synchronize at the end of the step, none per phase);
        ``extra["cpu_ms"]``: the process's CPU time over the step (``time.process_time``,
        every thread: steadier than wall time on a busy host)."""
        spec, dev, built, opt = self.spec, self.dev, self.built, self.opt
        scaler, autocast, gen, where = self.scaler, self.autocast, self.gen, self.where
        clock = _Clock(dev)
        cpu0 = time.process_time()
        loss_total = 0.0
        for _micro in range(spec.grad_accum_steps):
            x, y = built.make_batch(spec.batch_size, gen)
            x, y = x.to(dev), y.to(dev)
            where["phase"] = "forward"
            clock.mark("forward")
            with autocast():
                out = built.module(x)
            loss = built.loss_fn(out, y) / spec.grad_accum_steps
            where["phase"] = "backward"
            clock.mark("backward")
            (scaler.scale(loss) if scaler is not None else loss).backward()
            clock.mark(None)
            loss_total += float(loss.detach().float())
            del out, loss, x, y
        where["phase"] = "optimizer"
        clock.mark("optimizer")
        _optimizer_step(opt, scaler)
        opt.zero_grad(set_to_none=True)
        clock.mark(None)
        times = clock.totals()
        return StepRecord(
            step=where["step"],
            forward_ms=times["forward"],
            backward_ms=times["backward"],
            optimizer_ms=times["optimizer"],
            step_ms=sum(times.values()),
            loss=loss_total,
            extra={"pass": "timed", "cpu_ms": (time.process_time() - cpu0) * 1e3},
        ).record()

    def _one_step(self) -> dict[str, Any]:
        """One instrumented optimizer step over ``grad_accum_steps`` micro-batches; returns its record."""
        spec, dev, meter, built, params, opt = self.spec, self.dev, self.meter, self.built, self.params, self.opt
        scaler, autocast, gen, where = self.scaler, self.autocast, self.gen, self.where
        probe = meter.probe
        times = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        peaks = {"forward": 0, "backward": 0, "optimizer": 0}
        peak_cats: dict[str, dict[str, int]] = {}
        meter.recompute_peak = 0
        loss_total = 0.0
        first: dict[str, Any] = {}

        def phase_end(name: str, t_start: float) -> None:
            meter.sync()
            times[name] += (time.perf_counter() - t_start) * 1e3
            if probe.peak_bytes >= peaks[name]:
                peaks[name] = probe.peak_bytes
                if meter.exact:
                    peak_cats[name] = dict(probe.peak_by_category)

        for micro in range(spec.grad_accum_steps):
            x, y = built.make_batch(spec.batch_size, gen)
            x, y = x.to(dev), y.to(dev)
            meter.sync()
            probe.reset_peak()
            before = probe.live_bytes
            rng_before = meter.rng_state_bytes
            where["phase"] = "forward"
            meter.set_category(MemoryCategory.ACTIVATIONS)
            t0 = time.perf_counter()
            with autocast():
                out = built.module(x)
            loss = built.loss_fn(out, y) / spec.grad_accum_steps
            phase_end("forward", t0)
            meter.set_category(MemoryCategory.OTHER)
            if micro == 0:
                live = probe.live_bytes
                first = {
                    "allocated": live,
                    "activation_bytes": live - before,
                    "rng_state_bytes": meter.rng_state_bytes - rng_before,
                    "at_forward_end": meter.breakdown(params, opt, live, live - before, peak=False),
                }
            where["phase"] = "backward"
            probe.reset_peak()
            t1 = time.perf_counter()
            (scaler.scale(loss) if scaler is not None else loss).backward()
            phase_end("backward", t1)
            loss_total += float(loss.detach().float())
            del out, loss, x, y

        missing = sum(p.grad is None for p in params)
        where["phase"] = "optimizer"
        probe.reset_peak()
        t2 = time.perf_counter()
        _optimizer_step(opt, scaler)
        if len(opt.state) != meter.optimizer_states_tagged:  # state appears at the first step(s)
            meter.retag(list(optimizer_tensors(opt)), MemoryCategory.OPTIMIZER_STATE)
            meter.optimizer_states_tagged = len(opt.state)
        opt.zero_grad(set_to_none=True)
        phase_end("optimizer", t2)

        peak_phase = max(peaks, key=lambda k: peaks[k])
        step_peak = peaks[peak_phase]
        if not meter.exact:
            at_peak = meter.breakdown(params, opt, step_peak, step_peak if peak_phase != "optimizer" else 0, peak=True)
        else:
            at_peak = peak_cats.get(peak_phase, dict.fromkeys(CATEGORIES, 0))
        return StepRecord(
            step=where["step"],
            forward_ms=times["forward"],
            backward_ms=times["backward"],
            optimizer_ms=times["optimizer"],
            step_ms=sum(times.values()),
            allocated_bytes=first["allocated"],
            peak_allocated_bytes=step_peak,
            reserved_bytes=probe.reserved_bytes if meter.cuda else None,
            loss=loss_total,
            extra={
                "activation_bytes": first["activation_bytes"],
                "rng_state_bytes": first["rng_state_bytes"],
                "forward_peak_bytes": peaks["forward"],
                "backward_peak_bytes": peaks["backward"],
                "optimizer_peak_bytes": peaks["optimizer"],
                "recompute_peak_bytes": meter.recompute_peak,
                "memory_at_forward_end": first["at_forward_end"],
                "memory_at_peak": at_peak,
                "params_without_grad": missing,
                "nvml_used_bytes": meter.nvml_used(),
            },
        ).record()


class _Clock:
    """Phase times of one step, ms: ``perf_counter`` on CPU; on CUDA events recorded on the
    stream and read after one ``synchronize`` (PyTorch docs, "CUDA semantics: asynchronous
    execution"), so timing adds no per-phase synchronization."""

    def __init__(self, dev: torch.device):
        self.dev, self.cuda = dev, dev.type == "cuda"
        self.marks: list[tuple[str | None, Any]] = []

    def mark(self, phase: str | None) -> None:
        """Start ``phase`` now (None: the previous phase ends, no new one starts)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((phase, event))
        else:
            self.marks.append((phase, time.perf_counter()))

    def totals(self) -> dict[str, float]:
        """ms per phase (``forward``, ``backward``, ``optimizer``), summed over its spans."""
        if self.cuda:
            torch.cuda.synchronize(self.dev)
        out = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        for (phase, start), (_next, end) in zip(self.marks, self.marks[1:], strict=False):
            if phase is not None:
                out[phase] += start.elapsed_time(end) if self.cuda else (end - start) * 1e3
        return out


def _timing(records: list[dict[str, Any]], *, pass_name: str) -> dict[str, Any]:
    """Medians of the phases over ``records`` and their spread (see :mod:`ckptlab.stats`)."""
    out: dict[str, Any] = {"timing_pass": pass_name, "timing": {}}
    for key in ("step_ms", "forward_ms", "backward_ms", "optimizer_ms"):
        spread = describe([r[key] for r in records])
        out["timing"][key] = spread.as_dict() if spread else None
        out["step_time_ms" if key == "step_ms" else key] = spread.median if spread else None
    out["step_times_ms"] = [r["step_ms"] for r in records]
    return out


def _peak_facts(peak_rec: dict[str, Any]) -> dict[str, Any]:
    """Where the highest step's peak is (``peak_phase``: forward, backward or optimizer) and
    ``activation_bytes_at_peak``: the activation bytes live at that peak, the most that any
    checkpointing can take off it."""
    extra = peak_rec["extra"]
    phase = max(("forward", "backward", "optimizer"), key=lambda k: extra[f"{k}_peak_bytes"])
    return {
        "peak_phase": phase,
        "activation_bytes_at_peak": int(extra["memory_at_peak"].get(MemoryCategory.ACTIVATIONS, 0)),
    }
