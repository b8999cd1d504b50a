"""``predict_run``: a spec's memory on a target device, from a run on fake tensors.

The engine runs the spec's own steps (:class:`ckptlab.worker.engine.context.RunContext`:
the same model, strategy, AMP, accumulation and optimizer; strategy ``auto`` planned by
:func:`ckptlab.worker.engine.autoplan.plan_for_budget`) on fake tensors
(:mod:`ckptlab.worker.predict.fake`) under the engine's live-tensor tracker, with the
memory pass's early stop on: once the optimizer state exists every step reads the same
bytes, so the steps after the first two flat ones would read what they read (the real
memory pass's peak is the max over its steps after ``warmup_steps``, which the fake steps
reach). The summary is the engine's (:func:`ckptlab.worker.engine.summarize.summarize`,
:func:`ckptlab.worker.engine.run.conclude`), without the timing fields (fake tensors run no
kernels), the loss or a gradient check (no values), plus ``prediction``
(:class:`ckptlab.summary.PredictionInfo`, :mod:`ckptlab.worker.predict.verdict`).

On ``cpu`` the figures are a real CPU run's (tests/worker/predict/test_cpu_equals_real.py).
The fake memory pass records its memory timeline (issue 34) as a real run's does (its first
and peak steps; ``predict_run``'s ``on_timeline``): the fake tensors' bytes as the tracker
counts them, so on ``cpu`` its maximum is the predicted peak to the byte.
On a CUDA target they are the fake CPU count adjusted for the target (see
:mod:`ckptlab.worker.predict.fake`, :mod:`ckptlab.worker.predict.sdpa`,
:mod:`ckptlab.worker.predict.allocator`): allocations rounded to 512 B, attention's saved
tensors those of the backend the target picks, no CPU RNG states, the optimizer in its
``foreach`` form, the cuBLAS workspaces added to the allocated bytes (one per thread that
ran a matmul: forward's, and autograd's in backward; :func:`cublas_adjusted`), reserved
bytes from the allocator model, and the CUDA context.

Strategy ``auto`` on a CUDA target plans for ``checkpoint.budget_bytes`` less the cuBLAS
workspaces (its profile leaves them out); a request without a budget gets
:func:`ckptlab.prediction.budget.default_budget_bytes`. Block times are not measurable on fake tensors: the plan
weighs blocks by their forward FLOPs at :data:`ckptlab.worker.predict.fake.NOMINAL_FLOPS_PER_S`.

Example usage::

    from ckptlab.prediction.targets import get_target
    from ckptlab.worker.predict import predict_run

    summary = predict_run(spec, get_target("h100-80gb"))
    summary.prediction.fits, summary.prediction.device_used_bytes, summary.peak_allocated_bytes

Known limitations:
    - For the duration of a prediction, ``F.scaled_dot_product_attention``,
      ``torch.autograd.graph.save_on_cpu`` (CUDA targets) and transformers'
      ``masking_utils.is_tracing`` are replaced in the process (see
      :mod:`ckptlab.worker.predict.fake`): one prediction per process at a time, and no real
      run beside it (the API runs each in a child process).
    - What differs on a real CUDA device and is not modelled (autocast's op lists, cuDNN
      workspaces, allocator behaviour
      near the capacity) is listed in each prediction's notes; until ``scripts/gpu-check``
      has measured a card, its figures are unverified.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ckptlab.analysis.explain import format_bytes
from ckptlab.domain import MemoryCategory
from ckptlab.prediction.targets import Target
from ckptlab.spec.experiment import DistributedSpec, ExperimentSpec
from ckptlab.strategies import Strategy, get_strategy
from ckptlab.summary import RankFigures, RunSummary
from ckptlab.worker.distributed.shard import Rank
from ckptlab.worker.engine.autoplan import BudgetPlan, fixed_bytes_before_running, plan_for_budget
from ckptlab.worker.engine.context import RunContext
from ckptlab.worker.engine.run import TimelineCallback, conclude, hand_over_timelines, model_copies
from ckptlab.worker.engine.summarize import summarize
from ckptlab.worker.errors import RunError
from ckptlab.worker.models.base import Built
from ckptlab.worker.models.build import build_model
from ckptlab.worker.predict.allocator import peak_reserved_bytes
from ckptlab.worker.predict.fake import FakeGradScaler, FakeSession, fake_failure
from ckptlab.worker.predict.verdict import Facts, prediction_info

__all__ = ["predict_run", "cublas_adjusted"]

#: Summary fields a prediction does not have: times (fake tensors run no kernels) and the loss.
_NOT_PREDICTED = (
    "timing_pass",
    "timing",
    "step_time_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "step_times_ms",
    "final_loss",
)
_CPU = torch.device("cpu")


def predict_run(
    spec: ExperimentSpec,
    target: Target,
    *,
    capacity_bytes: int | None = None,
    model: Built | None = None,
    on_timeline: TimelineCallback | None = None,
) -> RunSummary:
    """Predict ``spec``'s memory on ``target`` without allocating it (see the module docstring).

    Args:
        spec: a validated spec; its ``device``, ``timed_steps``, ``paired_timing``,
            ``verify_gradients`` and ``memory_snapshot`` are not used (no real step runs).
        target: the device (:mod:`ckptlab.prediction.targets`).
        capacity_bytes: the device's memory, in place of the target's (bytes); on ``cpu``,
            which has none, also ``spec.memory_limit_bytes``. Default: None.
        model: a model in hand (as :func:`ckptlab.worker.engine.run.run_experiment`'s),
            copied onto fake tensors; the original, in the caller's memory, is not counted
            (the real run's tracker counts it too when it is on the run's device). Default: None.
        on_timeline: called, once the prediction has succeeded, with each memory timeline
            its fake memory pass kept (a :class:`ckptlab.analysis.timeline.StepTimeline` and
            whether it is the peak step's), as the real run's
            (:func:`ckptlab.worker.engine.run.run_experiment`): its first and peak steps.
            The timeline is the fake tensor count (bytes): on ``cpu`` its maximum is the
            predicted peak to the byte; on a CUDA target the prediction adds what is
            modelled, not counted (the cuBLAS workspaces), so the peak is above it. None for
            a sharded spec (its rank 0 is traced, not recorded) or with ``record_timeline``
            off. Default: None.

    Returns:
        The summary a real run on the target would have, memory only (bytes):
        ``peak_allocated_bytes``, ``peak_phase``, ``memory_at_peak``,
        ``memory_at_forward_end``, ``activation_bytes``, ``rng_state_bytes``,
        ``activation_bytes_at_peak``, ``recompute_peak_bytes``, ``plan`` for ``auto``, the
        findings and the peak sentence; on CUDA ``reserved_bytes``; and ``prediction``.

    Raises:
        RunError: the strategy compiles (``torch.compile`` cannot run on fake tensors), the
            target cannot run the AMP setting, no ``auto`` plan fits (naming the fixed
            memory per parameter and what would change it), the model fails on fake
            tensors (naming the op), or any other failure of the model.
    """
    strategy = get_strategy(spec.checkpoint.strategy)
    _check_predictable(spec, strategy, target)
    capacity = capacity_bytes if capacity_bytes is not None else target.capacity_bytes or spec.memory_limit_bytes
    # The memory pass as the engine runs it, early stop on (see the module docstring); the
    # spec's memory limit becomes the capacity instead of an emulated out-of-memory.
    spec = spec.model_copy(update={"memory_early_stop": True, "memory_limit_bytes": None})
    session = FakeSession(target)
    build = _constructor(spec, session, model)
    with warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")
        try:
            with session.active(), traced_rank(spec.distributed) as rank:
                planned, profile_peak = _plan(spec, strategy, session, build) if strategy.planned else (None, None)
                run = _fake_memory_pass(spec, strategy, session, build, planned, rank)
                summary = summarize(run)
                fixed = fixed_bytes_before_running(spec, run.built.module)
                kept = run.timelines
        except RunError as exc:
            exc.warnings = _messages(wlist)
            raise
        except Exception as exc:  # noqa: BLE001 - every failure of the model is the prediction's outcome
            why = fake_failure(exc) or f"{type(exc).__name__}: {exc}"
            raise RunError(why, warnings=_messages(wlist)) from exc
        caught = _messages(wlist)
    facts = Facts(
        target=target,
        capacity_bytes=capacity,
        fixed=fixed,
        param_count=summary.param_count or 0,
        spec=spec,
        strategy=strategy,
        session=session,
        profile_peak_bytes=profile_peak,
    )
    predicted = _as_prediction(summary, facts)
    hand_over_timelines(predicted, kept, on_timeline)
    return conclude(predicted, spec, strategy, planned, caught)


@contextlib.contextmanager
def traced_rank(distributed: DistributedSpec) -> Iterator[Rank | None]:
    """Rank 0 of a sharded spec over a fake process group
    (``torch.testing._internal.distributed.fake_pg``: collectives return at once and move
    no data), so that one process traces one rank of any world size; None for one process.

    Raises:
        RunError: this process already has a process group (a sharded prediction needs
            its own).
    """
    if distributed.kind == "none":
        yield None
        return
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RunError("a sharded prediction needs a process group of its own; this process already has one")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=distributed.world_size)
    try:
        yield Rank(rank=0, world_size=distributed.world_size, spec=distributed, device=_CPU)
    finally:
        dist.destroy_process_group()


def _constructor(spec: ExperimentSpec, session: FakeSession, model: Built | None) -> Callable[[], Built]:
    """What builds the model (the spec's, or copies of the model in hand), inside the
    session's construction phase."""
    make = model_copies(model, spec) if model is not None else lambda: build_model(spec.model)

    def build() -> Built:
        with session.building():
            return make()

    return build


def _check_predictable(spec: ExperimentSpec, strategy: Strategy, target: Target) -> None:
    """Refuse what cannot be predicted, saying why.

    Raises:
        RunError: a compiling strategy, a ddp spec, or bf16 on a CUDA card before compute
            capability 8.0.
    """
    if spec.distributed.kind == "ddp":
        raise RunError(
            "a ddp run cannot be predicted yet: DistributedDataParallel checks its parameters' values across "
            "ranks when it wraps the model, which fake tensors do not hold; predict fsdp2, or run ddp for real"
        )
    if strategy.compiles:
        raise RunError(
            f"strategy {strategy.name!r} cannot be predicted: torch.compile generates kernels that run on real "
            "memory (fake tensors have none) and allocates outside the live-tensor tracker's view; run it for real"
        )
    cc = target.compute_capability
    if spec.amp == "bf16" and target.device == "cuda" and cc is not None and cc < (8, 0):
        raise RunError(f"amp 'bf16' is not supported on {target.label} (compute capability {cc[0]}.{cc[1]})")


def _messages(wlist: list[warnings.WarningMessage]) -> list[str]:
    return list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in wlist))


def _fake_memory_pass(
    spec: ExperimentSpec,
    strategy: Strategy,
    session: FakeSession,
    build: Any,
    planned: BudgetPlan | None,
    rank: Rank | None = None,
) -> RunContext:
    """The engine's build and memory pass on fake tensors, under a meter set up for the
    target; a sharded spec's as its rank 0 (``rank``, over a fake process group)."""
    meter = session.new_meter()
    where = {"phase": "setup", "step": 0}
    run = RunContext(spec, strategy, _CPU, meter, where, None, fake=session.fake_run(), rank=rank)
    if spec.amp == "fp16":
        run.scaler = FakeGradScaler(_CPU.type)
    try:
        with meter.mode():
            run.build(build, planned.ranges if planned is not None else None)
            run.memory_pass()
    finally:
        if rank is not None:
            rank.close()
    return run


def _plan(spec: ExperimentSpec, strategy: Strategy, session: FakeSession, build: Any) -> tuple[BudgetPlan, int | None]:
    """Strategy ``auto``'s plan from a fake profile, and the profile step's peak (bytes, the
    real engine profiles without checkpointing first). On a CUDA target the planner's
    budget is the spec's less the two cuBLAS workspaces (forward's and backward's thread),
    which its profile leaves out; the plan reports the spec's budget and a predicted peak
    with the workspaces.

    Raises:
        RunError: no plan fits; when the fixed memory alone is over the budget, the message
            names it per parameter and what would change it.
    """
    budget = spec.checkpoint.budget_bytes
    assert budget is not None  # the spec requires it for a planned strategy
    workspace = session.target.cublas_workspaces_bytes if session.cuda else 0
    inner = spec.model_copy(
        update={"checkpoint": spec.checkpoint.model_copy(update={"budget_bytes": budget - workspace})}
    )
    if spec.checkpoint.search_compile:  # compiling needs real tensors (blocks/compiled.py)
        warnings.warn(
            "search_compile: a prediction cannot compile on fake tensors; this is the eager plan", stacklevel=2
        )
    try:
        planned = plan_for_budget(inner, _CPU, build, fake=session.fake_run())
    except RunError as exc:
        raise _no_plan(exc, budget, workspace) from exc
    tracker = session.tracker
    profile_peak = tracker.high_water_bytes + session.workspace_bytes if tracker else None
    # The room left out was both threads' workspaces; the peak adds those the profile step
    # allocated (no backward matmul, or no cuBLAS at all, allocates fewer).
    peak = planned.plan.predicted_peak_bytes + session.workspace_bytes
    return dataclasses.replace(
        planned, budget_bytes=budget, plan=dataclasses.replace(planned.plan, predicted_peak_bytes=peak)
    ), profile_peak


def _no_plan(exc: RunError, budget: int, workspace: int) -> RunError:
    """The planner's refusal, said for a prediction: the budget as given, and when the fixed
    memory alone is over it, that memory per parameter and what would change it."""
    details = {**exc.details, "budget_bytes": budget}
    fixed, params = exc.details.get("fixed_bytes"), exc.details.get("param_count")
    room = f" (less the cuBLAS workspaces, {format_bytes(workspace)})" if workspace else ""
    if fixed is None or params is None or "smallest_reachable_peak_bytes" in exc.details:
        return RunError(f"{exc}{room}", warnings=exc.warnings, details=details)
    per = fixed / max(params, 1)
    return RunError(
        f"no plan fits a budget of {format_bytes(budget)}{room}: parameters, gradients and optimizer state alone "
        f"need {format_bytes(fixed)} ({per:.0f} B per parameter for {params:,} parameters), before any "
        "activation, and checkpointing only removes activations; fewer bytes per parameter (bf16 parameters and "
        "gradients, an optimizer with less state such as sgd) or sharding them over ranks "
        "(distributed fsdp2: each of N ranks holds about 1/N) would change that",
        warnings=exc.warnings,
        details=details,
    )


def cublas_adjusted(summary: RunSummary, workspace_bytes: int) -> RunSummary:
    """``summary`` with the cuBLAS workspaces (bytes) added to its allocated figures, as a
    CUDA run's allocator counts them from the first matmul of each thread on: the peak, and
    ``other`` at the peak and at the end of forward (from the second step on, both threads'
    workspaces exist before forward begins)."""
    if not workspace_bytes:
        return summary
    other = MemoryCategory.OTHER.value
    data = summary.dump()
    data["peak_allocated_bytes"] = (summary.peak_allocated_bytes or 0) + workspace_bytes
    for key in ("memory_at_peak", "memory_at_forward_end"):
        figures = dict(data.get(key) or {})
        figures[other] = figures.get(other, 0) + workspace_bytes
        data[key] = figures
    return RunSummary.model_validate(data)


def _as_prediction(summary: RunSummary, facts: Facts) -> RunSummary:
    """The engine's summary of the fake run as a prediction: no timing or loss, the
    target's device, the CUDA adjustments and the ``prediction`` block."""
    data = {k: v for k, v in summary.dump().items() if k not in _NOT_PREDICTED}
    target, session = facts.target, facts.session
    data["device"] = target.device
    data["device_name"] = target.label
    data["memory_source"] = "predicted: fake tensors under the live-tensor tracker" + (
        f", modelled for {target.name}" if session.cuda else ""
    )
    summary = RunSummary.model_validate(data)
    reserved = None
    if session.cuda:
        summary = cublas_adjusted(summary, session.workspace_bytes)
        reserved = peak_reserved_bytes(session.events or [])
        summary.reserved_bytes = reserved
    summary.prediction = prediction_info(summary, facts, reserved)
    world = facts.spec.distributed.world_size
    if facts.spec.distributed.kind != "none":  # one rank traced: FSDP2 pads every shard alike
        summary.world_size, summary.global_batch_size, summary.worst_rank = world, facts.spec.batch_size * world, 0
        summary.ranks = [RankFigures.of(0, summary)]
    return summary
