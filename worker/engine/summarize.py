"""A run's summary from its step records: memory (bytes) from the memory pass, time (ms)
from the timing pass, and what the run paired, compiled and ran on, validated once into a
:class:`~ckptlab.summary.RunSummary` (see :func:`ckptlab.worker.engine.run.run_experiment`
for each field's source)."""

from __future__ import annotations

import math
import os
import statistics
from typing import Any, Protocol

import torch

from ckptlab.analysis.stats import describe, stored_paired_overhead
from ckptlab.domain import MemoryCategory
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import BASELINE
from ckptlab.summary import RunSummary
from ckptlab.worker.engine.training import environment
from ckptlab.worker.measure.meter import Meter, growth_per_step

__all__ = ["SummaryContext", "finite_or_none", "summarize"]


class SummaryContext(Protocol):
    """What the summary reads of a run (:class:`ckptlab.worker.engine.context.RunContext`)."""

    spec: ExperimentSpec
    dev: torch.device
    meter: Meter
    params: list[torch.nn.Parameter]
    records: list[dict[str, Any]]
    timed: list[dict[str, Any]]
    paired: list[dict[str, Any]]
    block_profile: list[dict[str, Any]] | None
    compile_ms: float | None
    pairing_skipped: str | None
    timing_threads: int | None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(run: SummaryContext) -> RunSummary:
    """The run's summary from its records: memory from the memory pass (warm-up steps left
    out of the medians), time from the timing pass (or the memory steps when there was
    none), the pairing and its overhead (``paired_overhead``), compile time and device facts.

    Raises:
        pydantic.ValidationError: a figure of the wrong type (a bug, never the run's data:
            non-finite floats are stored as None).
    """
    timed = run.timed
    measured = run.records[run.spec.warmup_steps :] or run.records
    values = {
        **_memory(run, measured),
        **_timing(timed or measured, pass_name="timed" if timed else "memory"),
        **_pairing(run),
        **_device(run),
    }
    summary = RunSummary.model_validate(finite_or_none(values))
    summary.paired_overhead = stored_paired_overhead(summary)  # once, here: reads serve it
    return summary


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, so the summary is valid JSON
    (a diverged run has a NaN loss and gradient difference)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    return value


def _memory(run: SummaryContext, measured: list[dict[str, Any]]) -> dict[str, Any]:
    """Bytes: activations and RNG states (medians), the peak and where it is, by category,
    the recomputation peak, growth per step; and the model's parameters and final loss."""
    records = run.records
    peak_rec = max(measured, key=lambda r: r["peak_allocated_bytes"])
    out = {
        "activation_bytes": int(_median([r["extra"]["activation_bytes"] for r in measured])),
        "rng_state_bytes": int(_median([r["extra"].get("rng_state_bytes", 0) for r in measured])),
        "peak_allocated_bytes": peak_rec["peak_allocated_bytes"],
        "recompute_peak_bytes": max(r["extra"]["recompute_peak_bytes"] for r in measured),
        "memory_at_peak": peak_rec["extra"]["memory_at_peak"],
        "memory_at_forward_end": measured[-1]["extra"]["memory_at_forward_end"],
        "params_without_grad": max(r["extra"]["params_without_grad"] for r in records),
        "memory_steps_run": len(records),
        "memory_steps_requested": run.spec.steps,
        "memory_growth_bytes_per_step": growth_per_step(measured),
        "param_count": sum(p.numel() for p in run.params),
        "final_loss": (run.timed or records)[-1]["loss"],
        "memory_source": run.meter.source,
        **_peak_facts(peak_rec),
    }
    if run.block_profile is not None:
        out["block_profile"] = run.block_profile
    return out


def _pairing(run: SummaryContext) -> dict[str, Any]:
    """The paired copy's step times (ms, round by round), or why there was none; CPU times
    of the run's own timed steps; the timing threads (CPU) and compile time."""
    out: dict[str, Any] = {}
    if run.paired:
        out["paired_with"] = BASELINE
        out["paired_baseline_step_times_ms"] = [r["step_ms"] for r in run.paired]
        out["paired_baseline_cpu_ms"] = [r["extra"]["cpu_ms"] for r in run.paired]
    if run.pairing_skipped:
        out["pairing_skipped"] = run.pairing_skipped
    if run.timed and "cpu_ms" in run.timed[0]["extra"]:
        out["step_cpu_ms"] = [r["extra"]["cpu_ms"] for r in run.timed]
    if run.compile_ms is not None:
        out["compile_ms"] = run.compile_ms
    if run.timed and not run.meter.cuda:
        out["timing_threads"] = run.timing_threads
    return out


def _device(run: SummaryContext) -> dict[str, Any]:
    """Where it ran; on CUDA also the reserved bytes and NVML's used bytes (max over steps)."""
    env = environment(run.dev)
    out: dict[str, Any] = {
        "device": str(run.dev),
        "device_name": env["device_name"] if run.meter.cuda else "cpu",
        "environment": env,
        "torch_version": torch.__version__,
    }
    if hasattr(os, "getloadavg"):  # what the step times were taken beside (not on Windows)
        out["host_load"] = _host_load(run, heap_kept=env["cpu_heap_kept"])
    if run.meter.cuda:
        out["reserved_bytes"] = max(r["reserved_bytes"] for r in run.records)
        used = [r["extra"]["nvml_used_bytes"] for r in run.records if r["extra"]["nvml_used_bytes"] is not None]
        out["nvml_used_bytes"] = max(used) if used else None
    return out


def _host_load(run: SummaryContext, *, heap_kept: bool) -> dict[str, Any]:
    """The host's load as the timing pass ended (:class:`ckptlab.summary.HostLoad`): the
    1-minute load average, and on CPU the share of its threads' time the timed steps got
    (their CPU time over wall time x threads: about 1 on a quiet host, 2/3 for one thread
    beside two busy loops on 2 cores) and whether the heap kept freed memory
    (``heap_kept``: the run's ``environment["cpu_heap_kept"]``)."""
    threads = run.timing_threads if not run.meter.cuda and run.timing_threads else 1
    out: dict[str, Any] = {"load_1m": os.getloadavg()[0], "cpus": os.cpu_count() or 1, "threads": threads}
    timed = [r for r in run.timed if "cpu_ms" in (r.get("extra") or {})]
    wall = sum(r["step_ms"] for r in timed)
    if timed and wall > 0 and not run.meter.cuda:
        out["cpu_share"] = sum(r["extra"]["cpu_ms"] for r in timed) / (wall * threads)
    if not run.meter.cuda:  # page faults or none: CPU step times differ by that alone
        out["heap_kept"] = heap_kept
    return out


def _timing(records: list[dict[str, Any]], *, pass_name: str) -> dict[str, Any]:
    """Medians of the phases over ``records`` and their spread (see :mod:`ckptlab.analysis.stats`)."""
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
