"""One optimizer step of a run, instrumented (the memory pass: phase times, peaks and memory
by category from the meter) or timed only (the timing pass: wall and CPU time, no
instrumentation). Both return a :class:`~ckptlab.summary.StepRecord`'s plain dict (times in
ms, memory in bytes)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from ckptlab.domain import MemoryCategory
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.summary import StepRecord
from ckptlab.worker.engine.training import FakeRun
from ckptlab.worker.measure.memory import CATEGORIES
from ckptlab.worker.measure.meter import Meter, optimizer_tensors
from ckptlab.worker.models.base import Built

__all__ = ["StepContext", "instrumented_step", "timed_step"]


class StepContext(Protocol):
    """What a step needs of its run (:class:`ckptlab.worker.engine.context.RunContext`)."""

    spec: ExperimentSpec
    dev: torch.device
    meter: Meter
    built: Built
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    autocast: Callable[[], Any]
    gen: torch.Generator
    where: dict[str, Any]
    fake: FakeRun | None


def _optimizer_step(opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    """``opt.step()``, through ``scaler`` (unscale, skip on inf, update) when AMP fp16 uses one."""
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()


def _enter(run: StepContext, phase: str) -> None:
    """The step enters ``phase``: ``run.where`` (out-of-memory reports) and, on a recorded
    step, the timeline recorder (:meth:`ckptlab.worker.measure.timeline.TimelineRecorder.phase`)."""
    run.where["phase"] = phase
    if run.meter.timeline is not None:
        run.meter.timeline.phase(phase)


def timed_step(run: StepContext) -> dict[str, Any]:
    """One optimizer step of the timing pass: times only, no memory instrumentation (its
    memory columns are None, explicitly). Wall times from ``time.perf_counter`` on CPU,
    from CUDA events on CUDA (one synchronize at the end of the step, none per phase);
    ``extra["cpu_ms"]``: the process's CPU time over the step (``time.process_time``,
    every thread: steadier than wall time on a busy host)."""
    spec, dev, built, opt = run.spec, run.dev, run.built, run.opt
    scaler, autocast, gen, where = run.scaler, run.autocast, run.gen, run.where
    clock = _Clock(dev)
    cpu0 = time.process_time()
    loss_total = 0.0
    for _micro in range(spec.grad_accum_steps):
        x, y = built.make_batch(spec.batch_size, gen)
        x, y = x.to(dev), y.to(dev)
        where["phase"] = "forward"
        clock.mark("forward")
        out, loss = built.output_and_loss(x, y, autocast)
        loss = loss / spec.grad_accum_steps
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


def instrumented_step(run: StepContext) -> dict[str, Any]:
    """One instrumented optimizer step over ``grad_accum_steps`` micro-batches; returns its
    record (its ``loss`` None on fake tensors, which hold no values)."""
    spec, dev, meter, built, params, opt = run.spec, run.dev, run.meter, run.built, run.params, run.opt
    scaler, autocast, gen, where = run.scaler, run.autocast, run.gen, run.where
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
        _enter(run, "forward")  # the batch is the forward's (a timeline's phases)
        x, y = built.make_batch(spec.batch_size, gen)
        x, y = x.to(dev), y.to(dev)
        meter.sync()
        probe.reset_peak()
        before = probe.live_bytes
        rng_before = meter.rng_state_bytes
        meter.set_category(MemoryCategory.ACTIVATIONS)
        t0 = time.perf_counter()
        out, loss = built.output_and_loss(x, y, autocast)
        loss = loss / spec.grad_accum_steps
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
        _enter(run, "backward")
        probe.reset_peak()
        t1 = time.perf_counter()
        (scaler.scale(loss) if scaler is not None else loss).backward()
        phase_end("backward", t1)
        if run.fake is None:
            loss_total += float(loss.detach().float())
        del out, loss, x, y

    missing = sum(p.grad is None for p in params)
    _enter(run, "optimizer")
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
        loss=loss_total if run.fake is None else None,
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
