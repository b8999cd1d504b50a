"""The experiment engine: train a model for a few steps under a checkpointing setting,
measure time and memory per step and phase, and check that the gradients are still right.

Measurement, per optimizer step (each may span ``grad_accum_steps`` micro-batches):

- ``forward_ms``, ``backward_ms``, ``optimizer_ms``, ``step_ms``: wall time in ms from
  ``time.perf_counter``; on CUDA every phase ends with ``torch.cuda.synchronize``.
- ``allocated_bytes``: live tensor bytes at the end of the first micro-batch's forward.
- ``peak_allocated_bytes``: the highest live tensor bytes during the step; per phase in
  ``extra`` (``forward_peak_bytes`` ...).
- Memory by category (``parameters`` incl. buffers, ``gradients``, ``optimizer_state``,
  ``activations``, ``other``) at the end of forward and at the step's peak. On CPU exact,
  from :class:`worker.memory.LiveTensorTracker`; on CUDA estimated from the tensors the
  engine knows (parameters, ``.grad``, optimizer state) with the rest split into
  activations (forward end: the activation bytes) and other.
- ``recompute_peak_bytes``: the most bytes a checkpointed group's recomputation added
  during backward (CPU: peak inside the recomputation minus live bytes at its start;
  CUDA: live bytes at its end minus at its start).
- On CUDA: ``reserved_bytes`` (``torch.cuda.memory_reserved``) and ``nvml_used_bytes``
  (device-wide used memory from NVML, like nvidia-smi: includes the CUDA context and other
  processes).

``activation_bytes`` (summary) is the median over measured steps of live bytes at the end of
forward minus live bytes just before it: the bytes autograd keeps for backward.

The memory pass stops early (``spec.memory_early_stop``) after two consecutive steps past
the warm-up with byte-identical readings (:func:`worker.meter.memory_is_flat`); the timing
pass that follows is numbered on from the last memory step and runs all ``timed_steps``.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ckptlab.domain import MemoryCategory
from ckptlab.explain import findings, peak_sentence
from ckptlab.spec import ExperimentSpec
from ckptlab.stats import describe
from ckptlab.summary import RunSummary, StepRecord
from worker.errors import RunError, RunOutOfMemory
from worker.gradcheck import verify_gradients
from worker.hostmem import is_out_of_memory, oom_details
from worker.memory import CATEGORIES, SimulatedOutOfMemoryError
from worker.meter import Meter, growth_per_step, memory_is_flat, optimizer_tensors, tag_optimizer_state
from worker.models import Built
from worker.training import (
    autocast_for,
    build_checkpointed,
    check_supported,
    environment,
    make_optimizer,
    resolve_device,
)

__all__ = ["resolve_device", "run_experiment", "verify_gradients", "environment", "StepCallback"]

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


def run_experiment(
    spec: ExperimentSpec,
    *,
    on_step: StepCallback | None = None,
    device: str | None = None,
    snapshot_path: str | None = None,
) -> dict[str, Any]:
    """Run ``spec`` and return its summary; ``on_step(record)`` gets each step as it ends.

    Args:
        spec: a validated experiment spec.
        on_step: called with a dict per optimizer step: ``step`` (1-based), the ``*_ms``
            timings, ``allocated_bytes``, ``peak_allocated_bytes``, ``reserved_bytes``
            (CUDA, else None), ``loss`` (sum of the scaled micro-batch losses; may be
            non-finite) and ``extra`` (phase peaks, categories, recompute and NVML bytes).
            Default: None.
        device: overrides ``spec.device`` (e.g. the worker slot's ``cuda:1``). Default: None.
        snapshot_path: where to write the CUDA memory snapshot when ``spec.memory_snapshot``
            is set (a pickle that pytorch.org/memory_viz opens). Default: None.

    Returns:
        The summary: ``device``, ``device_name``, ``activation_bytes``,
        ``peak_allocated_bytes`` (max over measured steps), ``recompute_peak_bytes``,
        ``step_time_ms`` and phase medians (warm-up excluded), ``memory_at_peak`` and
        ``memory_at_forward_end`` (bytes by category), ``params_without_grad`` (parameters
        whose ``.grad`` is None after backward, max over steps), ``memory_steps_run`` and
        ``memory_steps_requested`` (the memory pass's steps, run and asked for),
        ``memory_growth_bytes_per_step`` (see :func:`worker.meter.growth_per_step`; 0 when
        memory does not grow at every step), ``param_count``,
        ``final_loss``, the gradient check (see :func:`verify_gradients`), ``warnings``,
        ``environment``, ``torch_version`` and, on CUDA, ``reserved_bytes`` and
        ``nvml_used_bytes`` (max over steps) and ``snapshot_path``.

    Raises:
        RunOutOfMemory: CUDA out of memory, the CPU tracker's ``memory_limit_bytes`` passed,
            or a failed host allocation (a ``MemoryError``, torch's "can't allocate
            memory"; see :func:`worker.hostmem.oom_details`); ``details`` has ``phase``,
            ``step``, ``live_bytes``, ``limit_bytes``.
        RunError: anything else (bad device, unsupported AMP, ``CheckpointError``, a model
            error); ``warnings`` holds what was raised before.
    """
    caught: list[str] = []
    where = {"phase": "setup", "step": 0}
    meter: Meter | None = None
    with warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")

        def warnings_so_far() -> list[str]:
            return list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in wlist))

        try:
            dev = resolve_device(device or spec.device)
            check_supported(spec, dev)
            check = verify_gradients(spec, dev) if spec.verify_gradients else {}
            meter = Meter(dev, spec.memory_limit_bytes)
            summary = _measure(spec, dev, meter, where, on_step, snapshot_path)
        except RunError as exc:
            exc.warnings = warnings_so_far()
            raise
        except (SimulatedOutOfMemoryError, torch.OutOfMemoryError) as exc:
            # the simulated error carries the live bytes at the failing allocation; after
            # unwinding, the tracker already shows the frames' tensors freed
            live = getattr(exc, "live_bytes", None)
            if live is None and meter is not None:
                live = meter.probe.live_bytes
            limit = spec.memory_limit_bytes
            raise RunOutOfMemory(
                f"out of memory in {where['phase']} of step {where['step']}: {exc}",
                warnings=warnings_so_far(),
                details={**where, "live_bytes": live, "limit_bytes": limit},
            ) from exc
        except Exception as exc:  # noqa: BLE001 - every failure of the model is the run's outcome
            if is_out_of_memory(exc):  # host memory: the child's cap (worker.hostmem) or the machine's
                live = meter.probe.live_bytes if meter is not None and not meter.cuda else None
                details = oom_details(where, exc, live)
                msg = f"out of host memory in {where['phase']} of step {where['step']}: {type(exc).__name__}: {exc}"
                raise RunOutOfMemory(msg, warnings=warnings_so_far(), details=details) from exc
            raise RunError(f"{type(exc).__name__}: {exc}", warnings=warnings_so_far()) from exc
        caught = warnings_so_far()
    summary.update(check)
    summary["findings"] = findings(spec, summary)
    summary["peak_explanation"] = peak_sentence(summary, optimizer=spec.optimizer)
    summary["warnings"] = caught + [f"ckptlab: {f['message']}" for f in summary["findings"]]
    return RunSummary.model_validate(_finite_or_none(summary)).dump()


def _finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, so the summary is valid JSON
    (a diverged run has a NaN loss and gradient difference)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def _measure(
    spec: ExperimentSpec,
    dev: torch.device,
    meter: Meter,
    where: dict[str, Any],
    on_step: StepCallback | None,
    snapshot_path: str | None,
) -> dict[str, Any]:
    cuda = meter.cuda
    if cuda:
        if spec.memory_limit_bytes is not None:
            total = torch.cuda.get_device_properties(dev).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, spec.memory_limit_bytes / total), dev)
        torch.cuda.reset_peak_memory_stats(dev)
        if spec.memory_snapshot:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
    elif spec.memory_snapshot:
        warnings.warn("memory_snapshot needs CUDA; no snapshot recorded on CPU", stacklevel=2)

    autocast = autocast_for(spec, dev)
    scaler = torch.amp.GradScaler(dev.type) if spec.amp == "fp16" else None
    gen = torch.Generator().manual_seed(spec.seed)
    records: list[dict[str, Any]] = []
    timed: list[dict[str, Any]] = []
    try:
        with meter.mode():
            meter.set_category(MemoryCategory.PARAMETERS)
            built = build_checkpointed(spec, dev, on_recompute=meter.on_recompute)
            params = list(built.module.parameters())
            meter.retag(list(params) + list(built.module.buffers()), MemoryCategory.PARAMETERS)
            meter.set_category(MemoryCategory.OTHER)
            opt = make_optimizer(spec, params)
            tag_optimizer_state(opt, meter)
            for p in params:
                p.register_post_accumulate_grad_hook(lambda q: meter.retag([q.grad], MemoryCategory.GRADIENTS))
            for step in range(1, spec.steps + 1):
                where["step"] = step
                records.append(_one_step(spec, dev, meter, built, params, opt, scaler, autocast, gen, where))
                records[-1]["extra"]["pass"] = "memory"
                if on_step is not None:
                    on_step(records[-1])
                if spec.memory_early_stop and memory_is_flat(records, spec.warmup_steps):
                    break  # every further step would read the same bytes
            timed_range = range(len(records) + 1, len(records) + spec.timed_steps + 1)
            if cuda:  # the allocator's statistics cost nothing: timed steps keep their readings
                for step in timed_range:
                    where["step"] = step
                    timed.append(_one_step(spec, dev, meter, built, params, opt, scaler, autocast, gen, where))
                    timed[-1]["extra"]["pass"] = "timed"
                    if on_step is not None:
                        on_step(timed[-1])
        if not cuda:  # on CPU the timed pass runs with the tracker off (no dispatch mode)
            meter.tracking = False
            for step in timed_range:
                where["step"] = step
                timed.append(_timed_step(spec, dev, built, params, opt, scaler, autocast, gen, where))
                if on_step is not None:
                    on_step(timed[-1])
    finally:
        if cuda:
            if spec.memory_snapshot and snapshot_path:
                torch.cuda.memory._dump_snapshot(snapshot_path)
            if spec.memory_snapshot:
                torch.cuda.memory._record_memory_history(enabled=None)
            if spec.memory_limit_bytes is not None:
                torch.cuda.set_per_process_memory_fraction(1.0, dev)

    measured = records[spec.warmup_steps :] or records
    peak_rec = max(measured, key=lambda r: r["peak_allocated_bytes"])
    final_loss = (timed or records)[-1]["loss"]
    env = environment(dev)
    summary: dict[str, Any] = {
        "device": str(dev),
        "device_name": env["device_name"] if cuda else "cpu",
        "activation_bytes": int(_median([r["extra"]["activation_bytes"] for r in measured])),
        "peak_allocated_bytes": peak_rec["peak_allocated_bytes"],
        "recompute_peak_bytes": max(r["extra"]["recompute_peak_bytes"] for r in measured),
        **_timing(timed or measured, pass_name="timed" if timed else "memory"),
        "memory_at_peak": peak_rec["extra"]["memory_at_peak"],
        "memory_at_forward_end": measured[-1]["extra"]["memory_at_forward_end"],
        "params_without_grad": max(r["extra"]["params_without_grad"] for r in records),
        "memory_steps_run": len(records),
        "memory_steps_requested": spec.steps,
        "memory_growth_bytes_per_step": growth_per_step(measured),
        "param_count": sum(p.numel() for p in params),
        "final_loss": final_loss if math.isfinite(final_loss) else None,
        **_peak_facts(peak_rec),
        "environment": env,
        "torch_version": torch.__version__,
    }
    if cuda:
        summary["reserved_bytes"] = max(r["reserved_bytes"] for r in records)
        used = [r["extra"]["nvml_used_bytes"] for r in records if r["extra"]["nvml_used_bytes"] is not None]
        summary["nvml_used_bytes"] = max(used) if used else None
        if spec.memory_snapshot and snapshot_path:
            summary["snapshot_path"] = snapshot_path
    return summary


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


def _timed_step(spec, dev, built: Built, params, opt, scaler, autocast, gen, where) -> dict[str, Any]:
    """One optimizer step of the timing pass: wall times only, no memory instrumentation
    (its memory columns are None, explicitly)."""
    times = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    loss_total = 0.0
    for _micro in range(spec.grad_accum_steps):
        x, y = built.make_batch(spec.batch_size, gen)
        x, y = x.to(dev), y.to(dev)
        where["phase"] = "forward"
        t0 = time.perf_counter()
        with autocast():
            out = built.module(x)
        loss = built.loss_fn(out, y) / spec.grad_accum_steps
        times["forward"] += (time.perf_counter() - t0) * 1e3
        where["phase"] = "backward"
        t1 = time.perf_counter()
        (scaler.scale(loss) if scaler is not None else loss).backward()
        times["backward"] += (time.perf_counter() - t1) * 1e3
        loss_total += float(loss.detach().float())
        del out, loss, x, y
    where["phase"] = "optimizer"
    t2 = time.perf_counter()
    _optimizer_step(opt, scaler)
    opt.zero_grad(set_to_none=True)
    times["optimizer"] += (time.perf_counter() - t2) * 1e3
    return StepRecord(
        step=where["step"],
        forward_ms=times["forward"],
        backward_ms=times["backward"],
        optimizer_ms=times["optimizer"],
        step_ms=sum(times.values()),
        loss=loss_total,
        extra={"pass": "timed"},
    ).record()


def _one_step(spec, dev, meter: Meter, built: Built, params, opt, scaler, autocast, gen, where) -> dict[str, Any]:
    """One optimizer step over ``grad_accum_steps`` micro-batches; returns its record."""
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
            if not meter.cuda:
                peak_cats[name] = dict(probe.peak_by_category)

    for micro in range(spec.grad_accum_steps):
        x, y = built.make_batch(spec.batch_size, gen)
        x, y = x.to(dev), y.to(dev)
        meter.sync()
        probe.reset_peak()
        before = probe.live_bytes
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
    if meter.cuda:
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
