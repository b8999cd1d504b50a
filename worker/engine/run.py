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
  from :class:`ckptlab.worker.measure.memory.LiveTensorTracker`; on CUDA estimated from the tensors the
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
the warm-up with byte-identical readings (:func:`ckptlab.worker.measure.meter.memory_is_flat`); the timing
pass that follows is numbered on from the last memory step and runs all ``timed_steps``.
"""

from __future__ import annotations

import copy
import gc
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from ckptlab.analysis.explain import findings, oom_advice, peak_sentence
from ckptlab.analysis.timeline import StepTimeline
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import Strategy, get_strategy
from ckptlab.summary import RunSummary
from ckptlab.worker.engine.autoplan import BudgetPlan, plan_for_budget
from ckptlab.worker.engine.blocks.compiled import search_compiled
from ckptlab.worker.engine.context import RunContext, Sharding, StepCallback
from ckptlab.worker.engine.gradcheck import verify_gradients
from ckptlab.worker.engine.summarize import finite_or_none, summarize
from ckptlab.worker.engine.timeline import SNAPSHOT_MAX_ENTRIES, TimelineKeeper
from ckptlab.worker.engine.training import check_supported, environment, resolve_device
from ckptlab.worker.errors import RunError, RunOutOfMemory
from ckptlab.worker.measure.heap import keep_freed_heap
from ckptlab.worker.measure.hostmem import is_out_of_memory, oom_details
from ckptlab.worker.measure.memory import SimulatedOutOfMemoryError
from ckptlab.worker.measure.meter import Meter
from ckptlab.worker.models.base import Built

#: Called with each memory timeline a run keeps and whether it is the peak step's.
TimelineCallback = Callable[[StepTimeline, bool], None]

__all__ = [
    "TimelineCallback",
    "hand_over_timelines",
    "resolve_device",
    "run_experiment",
    "conclude",
    "model_copies",
    "verify_gradients",
    "environment",
    "StepCallback",
]


def run_experiment(
    spec: ExperimentSpec,
    *,
    on_step: StepCallback | None = None,
    device: str | None = None,
    snapshot_path: str | None = None,
    model: Built | None = None,
    rank: Sharding | None = None,
    on_timeline: TimelineCallback | None = None,
) -> RunSummary:
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
            is set (a pickle that pytorch.org/memory_viz opens): the allocator history of
            the step the memory timeline keeps as the peak step, or of the whole run where
            no timeline is recorded (a compiled run, ``record_timeline`` off). None (a
            sharded run's ranks): no history is recorded. Default: None.
        model: a model already built (``ckptlab.profile``'s model in hand): the engine and
            the gradient check train deep copies of it instead of building ``spec.model``
            (whose ``depth`` must be its number of blocks). Default: None.
        rank: this process's rank of a sharded run (``spec.distributed``; started by
            :func:`ckptlab.worker.distributed.launch.run_distributed`, which a sharded spec
            must be run with): the model is wrapped for it, strategy ``auto`` plans on rank
            0 and shares the plan, the single-process gradient check runs on rank 0 only and
            the timed steps are unpaired. Default: None (one process).
        on_timeline: called, once the run has measured, with each memory timeline kept
            (a :class:`ckptlab.analysis.timeline.StepTimeline` and whether it is the peak
            step's): the first step's and the peak step's of a CPU run read by the exact
            tracker (:mod:`ckptlab.worker.engine.timeline`; none on CUDA, for compiled
            runs or with ``record_timeline`` off). Default: None.

    On CPU the process's heap keeps freed memory from then on
    (:func:`ckptlab.worker.measure.heap.keep_freed_heap`: steps reuse it rather than fault
    fresh pages in, as on a GPU's caching allocator).

    Returns:
        The summary, a :class:`~ckptlab.summary.RunSummary` (its ``dump()`` is what is
        stored): ``device``, ``device_name``, ``activation_bytes``,
        ``peak_allocated_bytes`` (max over measured steps), ``recompute_peak_bytes``,
        ``step_time_ms`` and phase medians (warm-up excluded), ``memory_at_peak`` and
        ``memory_at_forward_end`` (bytes by category), ``params_without_grad`` (parameters
        whose ``.grad`` is None after backward, max over steps), ``memory_steps_run`` and
        ``memory_steps_requested`` (the memory pass's steps, run and asked for),
        ``memory_growth_bytes_per_step`` (see
        :func:`ckptlab.worker.measure.meter.growth_per_step`; 0 when memory does not grow
        at every step), ``param_count``, ``final_loss``, the gradient check (see
        :func:`verify_gradients`), ``findings``, ``warnings``, ``environment``,
        ``torch_version`` and, on CUDA, ``reserved_bytes`` and ``nvml_used_bytes`` (max
        over steps) and ``snapshot_path``.

    Raises:
        RunOutOfMemory: CUDA out of memory, the CPU tracker's ``memory_limit_bytes`` passed,
            or a failed host allocation (a ``MemoryError``, torch's "can't allocate
            memory"; see :func:`ckptlab.worker.measure.hostmem.oom_details`); ``details`` has ``phase``,
            ``step``, ``live_bytes``, ``limit_bytes``.
        RunError: anything else (bad device, unsupported AMP, ``CheckpointError``, a model
            error); ``warnings`` holds what was raised before.
    """
    if spec.distributed.kind != "none" and rank is None:
        raise RunError(
            f"a {spec.distributed.kind} spec runs one process per rank: ckptlab.worker.distributed.run_distributed"
        )
    # freed CPU memory reused as a caching allocator reuses it, not faulted in again each
    # step: page faults are not checkpointing's cost (ckptlab.worker.measure.heap)
    keep_freed_heap()
    caught: list[str] = []
    strategy = get_strategy(spec.checkpoint.strategy)  # resolved once; the run carries it
    where = {"phase": "setup", "step": 0}
    meter: Meter | None = None
    planned = None
    build = model_copies(model, spec) if model is not None else None
    with warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")

        def warnings_so_far() -> list[str]:
            return list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in wlist))

        try:
            dev = resolve_device(device or spec.device)
            check_supported(spec, dev)
            planned, check, run_spec = _plan_and_check(spec, strategy, dev, build, rank)
            strategy = get_strategy(run_spec.checkpoint.strategy)  # auto's compiled choice: compile_budget
            ranges = planned.ranges if planned is not None and run_spec is spec else None
            if strategy.compiles:
                # What an earlier compiled run of this process left (dynamo's caches, their
                # buffers) is freed now, not inside this run's allocator readings: freed
                # there, it read as negative bytes (peaks of 0 B in bench_compile's loop).
                torch._dynamo.reset()
                gc.collect()
            meter = Meter(dev, spec.memory_limit_bytes, allocator_events=strategy.compiles and dev.type == "cpu")
            run = RunContext(run_spec, strategy, dev, meter, where, on_step, rank=rank)
            summary = _measure(run, build, snapshot_path, ranges)
            kept = run.timelines
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
                f"out of memory in {where['phase']} of step {where['step']}: {exc}; {oom_advice(where['phase'])}",
                warnings=warnings_so_far(),
                details={**where, "live_bytes": live, "limit_bytes": limit},
            ) from exc
        except Exception as exc:  # noqa: BLE001 - every failure of the model is the run's outcome
            if is_out_of_memory(exc):  # host memory: the child's cap (ckptlab.worker.measure.hostmem) or the machine's
                live = meter.probe.live_bytes if meter is not None and meter.exact else None
                details = oom_details(where, exc, live)
                msg = (
                    f"out of host memory in {where['phase']} of step {where['step']}: {type(exc).__name__}: {exc}; "
                    f"{oom_advice(where['phase'])}"
                )
                raise RunOutOfMemory(msg, warnings=warnings_so_far(), details=details) from exc
            raise RunError(f"{type(exc).__name__}: {exc}", warnings=warnings_so_far()) from exc
        caught = warnings_so_far()
    summary = RunSummary.model_validate({**summary.dump(), **finite_or_none(check)})
    hand_over_timelines(summary, kept, on_timeline)
    return conclude(summary, run_spec, strategy, planned, caught)


def hand_over_timelines(
    summary: RunSummary, kept: list[tuple[StepTimeline, bool]], on_timeline: TimelineCallback | None
) -> None:
    """The kept memory timelines (``RunContext.timelines``) to ``on_timeline``, and the peak
    step's checkpointed regions (what each meant to keep against what it kept, bytes: a
    finding when more) to ``summary``; shared by the real run and the prediction."""
    keeps = next((tl.region_keeps for tl, is_peak in kept if is_peak), None)
    if keeps:
        summary.region_keeps = keeps
    for timeline, is_peak in kept if on_timeline is not None else ():
        on_timeline(timeline, is_peak)


def _plan_and_check(
    spec: ExperimentSpec,
    strategy: Strategy,
    dev: torch.device,
    build: Callable[[], Built] | None,
    rank: Sharding | None,
) -> tuple[BudgetPlan | None, dict, ExperimentSpec]:
    """Strategy ``auto``'s plan, the gradient check and the spec the run runs (``spec``, or
    the ``compile_budget`` spec of ``auto``'s compiled choice), before the measured run. A sharded
    run plans and checks on rank 0 only and shares the plan (one plan for every rank). With
    ``checkpoint.search_compile``, the compiled candidate is searched once the eager plan
    checkpoints something (:func:`ckptlab.worker.engine.blocks.compiled.search_compiled`),
    and the check runs what the run will: the compiled model when it is chosen; when its
    gradients differ (compiled dropout), the eager plan runs instead and is checked."""
    first = rank is None or rank.rank == 0
    planned = plan_for_budget(spec, dev, build) if strategy.planned and first else None
    if strategy.planned and rank is not None:
        planned = rank.share(planned)
    checked, ranges = spec, planned.ranges if planned is not None else None
    if planned is not None and spec.checkpoint.search_compile and planned.plan.checkpointed_blocks:
        eager = planned.timing.overhead(planned.plan.segments).estimate if planned.timing is not None else None
        planned.compiled = search_compiled(spec, dev, build, eager_overhead=eager, budget_bytes=planned.budget_bytes)
        if planned.compiled.chosen:
            checked, ranges = planned.compiled.run_spec(spec), None
    check = verify_gradients(checked, dev, build, ranges) if spec.verify_gradients and first else {}
    if checked is not spec and check.get("gradients_match") is False:  # compiled dropout's own masks
        planned.compiled.chosen = False  # type: ignore[union-attr]
        planned.compiled.why_not = (  # type: ignore[union-attr]
            "its gradients differ from the un-checkpointed model's (torch.compile draws other dropout masks)"
        )
        checked = spec
        check = verify_gradients(spec, dev, build, planned.ranges)  # type: ignore[union-attr]
    return planned, check, checked


def conclude(
    summary: RunSummary, spec: ExperimentSpec, strategy: Strategy, planned: BudgetPlan | None, caught: list[str]
) -> RunSummary:
    """``summary`` with what follows from its figures set on it: the plan of strategy
    ``auto`` (``plan``, ``budget_bytes``, ``predicted_peak_bytes``), the findings, the peak
    sentence, and the warnings (``caught``, then the findings'). Shared by the real run and
    the prediction (:mod:`ckptlab.worker.predict`)."""
    if planned is not None:
        summary.plan = planned.summary()
        summary.budget_bytes = planned.budget_bytes
        summary.predicted_peak_bytes = planned.predicted_peak_bytes
    summary.findings = findings(spec, summary, strategy)
    summary.peak_explanation = peak_sentence(summary, optimizer=spec.optimizer)
    summary.warnings = caught + [f"ckptlab: {f.message}" for f in summary.findings]
    return summary


def model_copies(model: Built, spec: ExperimentSpec) -> Callable[[], Built]:
    """Fresh deep copies of a model in hand (same weights each call: the gradient check
    builds two, the engine one).

    Raises:
        RunError: its number of blocks is not ``spec.model.depth``.
    """
    depth = getattr(spec.model, "depth", len(model.blocks))
    if len(model.blocks) != depth:
        raise RunError(f"the model has {len(model.blocks)} blocks but model.depth is {depth}")
    return lambda: copy.deepcopy(model)


def _measure(
    run: RunContext,
    build: Callable[[], Built] | None,
    snapshot_path: str | None,
    ranges: list[tuple[int, int]] | None = None,
) -> RunSummary:
    """Set the device up, run the memory pass and the timed pass, put the device back and
    summarize (see the module docstring)."""
    spec, dev, meter = run.spec, run.dev, run.meter
    # with a timeline, the snapshot is of its peak step (TimelineKeeper); else the whole run's
    wanted = bool(spec.memory_snapshot and snapshot_path)  # (a rank is given no path)
    whole_run = wanted and not TimelineKeeper.records(run, one_process=run.rank is None)
    if meter.cuda:
        if spec.memory_limit_bytes is not None:
            total = torch.cuda.get_device_properties(dev).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, spec.memory_limit_bytes / total), dev)
        meter.probe.reset_peak()  # through the probe: it keeps its windows' top (CudaProbe)
        if whole_run:
            torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_MAX_ENTRIES)
    elif spec.memory_snapshot:
        warnings.warn("memory_snapshot needs CUDA; no snapshot recorded on CPU", stacklevel=2)
    try:
        with meter.mode():
            run.build(build, ranges)
            run.memory_pass(snapshots=wanted)
            if meter.cuda:  # the allocator's statistics cost nothing: timed steps keep their readings
                run.timed_pass()
        if not meter.cuda:  # on CPU the timed pass runs with the tracker off (no dispatch mode)
            meter.tracking = False
            run.timed_pass()
    finally:
        if meter.cuda:
            if whole_run:
                torch.cuda.memory._dump_snapshot(snapshot_path)
                torch.cuda.memory._record_memory_history(enabled=None)
            elif run.peak_snapshot is not None:
                Path(snapshot_path).write_bytes(run.peak_snapshot)  # type: ignore[arg-type]
            if spec.memory_limit_bytes is not None:
                torch.cuda.set_per_process_memory_fraction(1.0, dev)
    summary = summarize(run)
    if meter.cuda and wanted and Path(snapshot_path).is_file():  # type: ignore[arg-type]
        summary.snapshot_path = snapshot_path
    return summary
