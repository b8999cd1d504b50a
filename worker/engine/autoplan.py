"""Strategy ``auto``: profile the model's blocks once, then plan which to checkpoint for
``checkpoint.budget_bytes`` with :func:`ckptlab.planning.planner.plan_chain`.

The profile is one un-checkpointed training step of a copy of the model (same weights,
same first batch), measured with the run's own instruments (the exact live-tensor tracker
on CPU, the allocator on CUDA):

- per block (:class:`ckptlab.worker.engine.block_profile.BlockRecorder`): bytes alive after its forward
  minus before (``retained``), its forward's temporaries, its backward's, its input and
  output bytes, whether its output is already freed when its gradient arrives, what its
  forward holds up to the last tensor it saves (where a recomputation stops) and its
  parameters' gradient bytes;
- the fixed memory: what is alive when the forward starts (parameters, buffers, the
  batch), the optimizer state after the step, the stem's activations and the blocks'
  other arguments that a checkpoint keeps to its backward;
- what the part after the blocks leaves alive while the blocks run backward, and the peak
  of the backward after theirs (the stem's);
- the forward-and-backward peak, from which the planner's ``head_bytes`` is calibrated,
  and the optimizer step's own peak.

Time is measured apart, after the profile step, on the same copy without the tracker
(:func:`ckptlab.worker.engine.block_timing.time_chain`, issue 31): each block's forward and
the un-checkpointed step, over interleaved rounds on the timing pass's threads and clock,
identical blocks pooled. The planner minimizes the blocks' median forward times; the plan
states its ``predicted_overhead`` (the recomputation over the un-checkpointed step, with an
interval), and so do the planner's front (``front``: the plan at budgets from the smallest
reachable peak to the un-checkpointed one) and the per-block and sequential plans of the
same model (``alternatives``), so that each compares with its own measured paired
overhead. On fake tensors (a prediction) the forward times are the fake clock's proxy and
no overhead is predicted.

Per block the planner chooses among keep, recompute all, and (non-reentrant checkpoints,
issue 31) recompute all but the outputs of the ops a selective policy saves
(``save_matmuls_and_attention``, ``save_matmuls``): each block checkpointed alone under
each policy is measured on the run's meter after the profile step and timed in the
timing pass (:func:`ckptlab.worker.engine.blocks.apart.measured_apart`); a selective
block runs as a one-block ``CheckpointedGroup`` with that policy's ``context_fn``
(:attr:`BudgetPlan.ranges`). Offload (``save_on_cpu``) is not in the search, by decision:
on CPU it moves nothing off the device, and on a GPU it was not measured.

Every term of the prediction is one of these readings (:func:`_memory_model`), no margin:
on CPU it equals the measured peak of every plan tried on the built-in MLP, transformer and
ResNet generator and the Hugging Face Llama, GPT-2, ResNet, ViT and ConvNeXt (issue 21), or
lies a few percent above (a DenseNet); per_block's plan is predicted at per_block's measured
peak (issue 31). With ``search_compile``, torch.compile's own budget is a measured choice
beside the plan (:mod:`ckptlab.worker.engine.blocks.compiled`, run by the engine).

Before anything runs, a budget below parameters + gradients + optimizer state (computed
from the parameters and the optimizer, no step needed) fails at once with the reason.

Example usage (what the engine does)::

    plan = plan_for_budget(spec, dev, build)
    apply_strategy(blocks, spec.checkpoint, device=dev, ranges=plan.ranges)

Known limitations:
    - The profile step runs without checkpointing: on a device where the un-checkpointed
      step does not fit, ``auto`` cannot profile (Rotor profiles block by block instead).
    - The blocks must form a chain that the model's own forward runs once each, in order
      (the engine's contract for every kind).
    - On CUDA the allocator rounds allocations up (512 B blocks) and keeps workspaces; the
      profile sees them as the run will, but cuBLAS workspaces created after the profile
      step are not in the calibration. On CUDA the margin-free prediction has been
      checked on one card (an H200, docs/benchmarks.md "2026-11-27: the lent H200
      again"): 12 of 12 plans of issue 31's transformer 212 B above their measured peak,
      and a forced plan of two two-block segments 264,704 B below it (bytes the allocator
      holds that no tensor owns, in the first segment's backward).
    - Under ``amp`` (autocast), a checkpointed block's parameter casts stay in autocast's
      cast cache until the forward ends; the model does not count them: on the built-in
      transformer with bf16, 1,152 B per checkpointed block (its four biases' bf16 copies)
      above the prediction (found in review, 2026-11-26; fp32 plans are exact).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ckptlab.analysis.explain import bytes_apart, format_bytes, size_fields
from ckptlab.planning.front import plan_front
from ckptlab.planning.planner import BlockProfile, ChainPlan, NoPlanFits, Segment, plan_chain, smallest_peak_plan
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import BASELINE
from ckptlab.worker.engine.block_profile import BlockRecorder, profile_record
from ckptlab.worker.engine.block_timing import ChainTimes
from ckptlab.worker.engine.blocks.apart import measured_apart
from ckptlab.worker.engine.blocks.compiled import COMPILE, CompiledChoice
from ckptlab.worker.engine.plan_overheads import alternatives, plan_record
from ckptlab.worker.engine.training import FakeRun, autocast_for, build_checkpointed, make_optimizer
from ckptlab.worker.errors import RunError
from ckptlab.worker.measure.meter import Meter, optimizer_tensors, storage_bytes
from ckptlab.worker.models.base import Built

__all__ = ["BudgetPlan", "plan_for_budget", "fixed_bytes_before_running"]

#: Bytes of Adam's per-parameter state per gradient byte (``exp_avg``, ``exp_avg_sq``).
_STATE_PER_GRAD_BYTE = {"adam": 2, "adamw": 2, "sgd": 0}


@dataclass
class BudgetPlan:
    """The plan ``auto`` runs and what it was made from.

    Attributes:
        plan: the planner's answer (segments, checkpointed blocks, recomputation ms,
            predicted peak bytes).
        budget_bytes: the budget asked for.
        blocks: the block profiles the plan was made from.
        fixed_bytes: parameters + optimizer state + gradients outside the blocks (bytes).
        calibration_bytes: the planner's ``head_bytes``: what the part after the blocks
            holds at the end of forward, calibrated on the profile step.
        optimizer_peak_bytes: the optimizer step's own peak (bytes; no plan changes it).
        profile_ms: wall time of profiling, timing and planning, ms.
        timing: the blocks' and the un-checkpointed step's times
            (:func:`ckptlab.worker.engine.block_timing.time_chain`), or None (fake tensors,
            or the blocks could not be timed apart: ``timing_error`` says why).
        front: the planner's front, ``(budget bytes, plan)``, lowest budget first
            (:func:`ckptlab.planning.front.plan_front`).
        alternatives: the uniform strategies' settings as plans of the same chain under
            the same model (:func:`ckptlab.worker.engine.plan_overheads.uniform_settings`),
            ``(setting, plan)``.
        timing_error: why the blocks were not timed apart, or None.
        compiled: ``checkpoint.search_compile``'s compiled candidate
            (:mod:`ckptlab.worker.engine.blocks.compiled`), or None; when ``chosen``, the
            run compiles and the plan's predicted peak and overhead are its measured ones.
    """

    plan: ChainPlan
    budget_bytes: int
    blocks: list[BlockProfile] = field(default_factory=list)
    fixed_bytes: int = 0
    calibration_bytes: int = 0
    optimizer_peak_bytes: int = 0
    profile_ms: float = 0.0
    timing: ChainTimes | None = None
    front: list[tuple[int, ChainPlan]] = field(default_factory=list)
    alternatives: list[tuple[dict[str, Any], ChainPlan]] = field(default_factory=list)
    timing_error: str | None = None
    compiled: CompiledChoice | None = None

    @property
    def predicted_peak_bytes(self) -> int:
        """The peak the run is predicted at (bytes): the compiled choice's, or the plan's."""
        chosen = self.compiled is not None and self.compiled.chosen and self.compiled.peak_bytes is not None
        return self.compiled.peak_bytes if chosen else self.plan.predicted_peak_bytes  # type: ignore[union-attr,return-value]

    @property
    def ranges(self) -> list[tuple[int, int] | tuple[int, int, str]]:
        """Half-open block ranges of the checkpointed segments (``apply_strategy``'s
        ``ranges``), ``(start, end, policy)`` for a selective one."""
        return [(s.start, s.end, *([s.policy] if s.policy else [])) for s in self.plan.segments if s.checkpointed]

    def summary(self) -> dict[str, Any]:
        """The run summary's ``plan`` field: the plan run (``segments``,
        ``checkpointed_blocks``, ``recompute_ms``, ``predicted_overhead``), the memory
        model's terms (bytes), the timing (``timing``, or ``timing_error``), the front
        (``front``: ``budget_bytes``, ``predicted_peak_bytes``, ``predicted_overhead``
        per point) and the ``alternatives`` (the setting: ``name``, ``strategy``, ``segments``
        (sequential's count), ``every`` ...; its plan as :func:`plan_record` gives it, the
        segment list as ``plan_segments``)."""
        out = {
            **plan_record(self.plan, self.timing),
            "fixed_bytes": self.fixed_bytes,
            "calibration_bytes": self.calibration_bytes,
            "optimizer_peak_bytes": self.optimizer_peak_bytes,
            "profile_ms": self.profile_ms,
            "blocks": [profile_record(b) for b in self.blocks],
            # what the search could choose per block beside keep and recompute (none in a
            # prediction on fake tensors, nor with use_reentrant: nothing measured them)
            "selective_policies": sorted({p for b in self.blocks for p in b.policies}),
            "timing": self.timing.public() if self.timing is not None else None,
            "front": [{"budget_bytes": budget, **plan_record(p, self.timing)} for budget, p in self.front],
            "alternatives": [_alternative(setting, plan_record(p, self.timing)) for setting, p in self.alternatives],
        }
        if self.timing_error is not None:
            out["timing_error"] = self.timing_error
        if self.compiled is not None:  # what ran when chosen; the eager plan's own figures kept
            out["compiled"] = self.compiled.public()
            out["chosen"] = COMPILE if self.compiled.chosen else "checkpoints"
            if self.compiled.chosen:
                out["eager_prediction"] = {k: out[k] for k in ("predicted_peak_bytes", "predicted_overhead")}
                out.update(predicted_peak_bytes=self.compiled.peak_bytes, predicted_overhead=self.compiled.overhead)
        return out


def _refusal(
    spec: ExperimentSpec, least: ChainPlan, budget: int, fixed: int, opt_peak: int, tail_peak: int
) -> RunError:
    """The error for a budget no plan fits (bytes): the smallest reachable peak (``least``'s,
    at least the optimizer step's and the tail's own peaks) and why, with what to change."""
    smallest = max(least.predicted_peak_bytes, opt_peak, tail_peak)
    advice = f"lower {size_fields(spec)}, or raise the budget"
    if opt_peak >= smallest:
        why = f"the optimizer step alone peaks at {format_bytes(opt_peak)}"
        advice = "checkpointing cannot help: use a smaller model, an optimizer with less state (sgd) or a larger budget"
    elif tail_peak >= smallest:
        why = f"the backward of the part before the blocks alone peaks at {format_bytes(tail_peak)}"
    else:
        ckpt, n = least.checkpointed_blocks, least.segments[-1].end
        which = "every block" if len(ckpt) == n else f"blocks {list(ckpt)}" if ckpt else "no block"
        if selective := {s.start: s.policy for s in least.segments if s.policy}:
            which += f" ({', '.join(f'block {i} selective, {p}' for i, p in selective.items())})"
        why = f"checkpointing {which} still keeps {format_bytes(smallest - fixed)} above the fixed memory"
    budget_words, smallest_words = bytes_apart(budget, smallest)
    return RunError(
        f"no plan fits a budget of {budget_words}: the smallest reachable peak is {smallest_words} ({why}; "
        f"fixed memory {format_bytes(fixed)}): {advice}",
        details={"budget_bytes": budget, "fixed_bytes": fixed, "smallest_reachable_peak_bytes": smallest},
    )


def _alternative(setting: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """An alternative's setting and its plan's record, the plan's segment list as
    ``plan_segments`` (the setting's ``segments`` is sequential's count)."""
    record["plan_segments"] = record.pop("segments")
    return {**setting, **record}


def fixed_bytes_before_running(spec: ExperimentSpec, module: torch.nn.Module) -> tuple[int, str]:
    """Parameters + buffers + gradients + optimizer state of ``module`` under ``spec``'s
    optimizer (bytes), counted from the tensors without running a step, and a sentence
    naming the parts. Adam/AdamW keep two tensors the size of each gradient
    (``exp_avg``, ``exp_avg_sq``; torch.optim.Adam docs); SGD without momentum none."""
    params = storage_bytes(iter([*module.parameters(), *module.buffers()]))
    grads = storage_bytes(p for p in module.parameters() if p.requires_grad)
    state = _STATE_PER_GRAD_BYTE[spec.optimizer] * grads
    words = f"parameters {format_bytes(params)} + gradients {format_bytes(grads)}"
    if state:
        words += f" + {spec.optimizer} state {format_bytes(state)}"
    return params + grads + state, words


def plan_for_budget(
    spec: ExperimentSpec, dev: torch.device, build: Callable[[], Built] | None, fake: FakeRun | None = None
) -> BudgetPlan:
    """Profile a copy of the model and plan for ``spec.checkpoint.budget_bytes``.

    ``fake``: profile on fake tensors (a prediction: the caller has entered the fake mode)
    with its meter, clock and optimizer (:class:`ckptlab.worker.engine.training.FakeRun`).

    Raises:
        RunError: no plan fits: the budget is below the fixed memory (found before any
            step runs; ``details``: ``budget_bytes``, ``fixed_bytes``, ``param_count``), or
            below the smallest reachable peak, or below the optimizer step's own peak; the
            message gives the smallest reachable peak and why.
    """
    t0 = time.perf_counter()
    budget = spec.checkpoint.budget_bytes
    assert budget is not None  # the spec requires it for a planned strategy
    baseline = spec.checkpoint.model_copy(update={"strategy": BASELINE})
    unplanned = spec.model_copy(update={"checkpoint": baseline})
    torch.manual_seed(spec.seed)
    meter = fake.new_meter() if fake is not None else Meter(dev, None)
    with meter.mode():
        built = build_checkpointed(unplanned, dev, build=build, fake=fake is not None)
        fixed, words = fixed_bytes_before_running(spec, built.module)
        if fixed >= budget:
            budget_words, fixed_words = bytes_apart(budget, fixed)
            raise RunError(
                f"no plan fits a budget of {budget_words}: {words} alone are {fixed_words}, "
                "before any activation; checkpointing cannot help: use a smaller model, an optimizer with "
                "less state (sgd) or a larger budget",
                details={
                    "budget_bytes": budget,
                    "fixed_bytes": fixed,
                    "param_count": sum(p.numel() for p in built.module.parameters()),
                },
            )
        step = _profile_step(spec, dev, meter, built, fake)
    state = storage_bytes(optimizer_tensors(step.optimizer))
    # What each checkpoint's RNG state adds where the meter counts it (issue 19: the CPU
    # tracker counts torch.get_rng_state()'s tensors; CUDA's allocator never holds them).
    rng_bytes = torch.get_rng_state().nbytes if meter.counts_rng_states and spec.checkpoint.preserve_rng_state else 0
    profiles, model, tail_peak = _memory_model(spec, step, state, rng_bytes)
    timing, timing_error = (None, None)
    if fake is None:  # measured apart, not under the tracker; selective bytes under it
        profiles, timing, timing_error = measured_apart(spec, dev, built, meter, step.optimizer, profiles)
    fixed = model["fixed_bytes"]
    opt_peak = step.optimizer_peak_bytes
    # No plan goes under the optimizer step's peak or the tail's (the stem's backward, after
    # the blocks'): both are measured, the same under every plan.
    floor = max(opt_peak, tail_peak)
    try:
        if floor > budget:
            raise NoPlanFits(plan_chain(profiles, budget_bytes=10**18, **model), fixed_bytes=fixed, budget_bytes=budget)
        # Without checkpointing the run is the profile step itself (plus the optimizer
        # state): that peak is measured, not modelled.
        unplanned = step.peak_bytes + state
        if spec.grad_accum_steps == 1 and max(unplanned, floor) <= budget:
            everything = (Segment(0, len(profiles), False),)
            plan = ChainPlan(everything, (), 0.0, max(unplanned, floor))
        else:
            plan = plan_chain(profiles, budget_bytes=budget, **model)
    except NoPlanFits as exc:
        raise _refusal(spec, smallest_peak_plan(profiles, **model), budget, fixed, opt_peak, tail_peak) from exc
    if floor > plan.predicted_peak_bytes:
        plan = ChainPlan(plan.segments, plan.checkpointed_blocks, plan.recompute_ms, floor)
    return BudgetPlan(
        plan=plan,
        budget_bytes=budget,
        blocks=profiles,
        fixed_bytes=fixed,
        calibration_bytes=model["head_bytes"],
        optimizer_peak_bytes=opt_peak,
        timing=timing,
        front=plan_front(profiles, points=12 if len(profiles) <= 24 else 6, floor_bytes=floor, **model),
        alternatives=alternatives(spec.checkpoint, profiles, model, floor),
        timing_error=timing_error,
        profile_ms=(time.perf_counter() - t0) * 1e3,
    )


def _memory_model(
    spec: ExperimentSpec, step: _ProfileStep, state: int, rng_state_bytes: int = 0
) -> tuple[list[BlockProfile], dict[str, int], int]:
    """The planner's memory model from the profile step (bytes; ``state``: the optimizer
    state, which the profile step did not have while it ran): the block profiles, the
    keyword arguments of :func:`ckptlab.planning.planner.plan_chain` and the tail's peak (the
    backward after the blocks', 0 without one: a floor no plan changes). Every term is a
    reading of the profile step; nothing is a margin:

    - ``fixed_bytes``: alive throughout: what was alive when the forward started
      (parameters, the batch), the optimizer state, the stem's activations, and the blocks'
      other arguments that the un-checkpointed step frees after forward, which a checkpoint
      keeps to its backward (1 KiB of the tiny Llama's, under-predicted without);
    - ``head_bytes``: at the end of forward the part after the blocks holds the rest of the
      un-checkpointed peak (calibrated so that the model predicts the profile step's own peak);
    - ``backward_bytes``: what the part after the blocks leaves alive while the blocks run
      backward (its parameters' gradients, the output and loss the caller holds): live bytes
      when the gradient of the last block's output arrives, less the fixed bytes, every
      block's kept bytes and that gradient. Negative where the model's forward frees
      tensors of its stem as it returns (GPT-2's token and position embeddings) that
      outweigh those (issue 31); at most the stem's bytes below zero, the first block's
      input excepted;
    - ``checkpoint_bytes``: ``rng_state_bytes``, the RNG state each checkpoint keeps with
      ``preserve_rng_state`` where the meter counts it (the CPU tracker; a CUDA run's
      states are host memory, outside the device allocator's figures). (Counting every gradient outside the blocks
      instead, the stem's included, which only exist once the blocks' backward is over,
      over-predicted the MLP 16x256 by 237 KiB, 1.2%: issue 21.)

    With gradient accumulation the profile step records its second micro-batch, which runs
    with every gradient alive (in ``start_bytes``; the blocks add none) and holds each new
    gradient until it is added in place (in ``backward_bytes``): the later micro-batches
    are the ones that peak.
    """
    profiles = step.blocks
    kept = sum(b.retained_bytes for b in profiles)
    head = max(step.peak_bytes - step.start_bytes - step.stem_bytes - kept, 0)
    fixed = step.start_bytes + state + step.stem_bytes + step.side_freed_bytes
    if step.blocks_backward_live is None:  # no block output needed a gradient: nothing to count
        after_blocks = 0
    else:
        last = profiles[-1]  # its kept bytes less what the head's backward freed, and its output's gradient
        alive = step.start_bytes + step.stem_bytes + kept - last.released_bytes + last.out_bytes
        after_blocks = step.blocks_backward_live - alive
    # Negative where the model's forward, returning, frees more of the stem's tensors than
    # the head's backward leaves (issue 31's GPT-2: its token and position embeddings,
    # 655,360 B, against the gradients of its tied embedding and final norm and the loss,
    # 513,036 B: -142,324 B, which the former clamp at 0 added to every backward term, so
    # that per_block's exact peak was refused as a budget). No plan changes either; only
    # the stem's tensors can go, never the first block's input, which every plan keeps to
    # the blocks' backward.
    freeable = max(step.stem_bytes - profiles[0].input_bytes, 0) if profiles else 0
    tail = step.tail_top + state if step.tail_top is not None else 0
    if spec.grad_accum_steps > 1:  # profiled in a later micro-batch: every gradient is in start_bytes
        profiles = [replace(b, param_bytes=0) for b in profiles]
    model = {
        "fixed_bytes": fixed,
        "head_bytes": head,
        "backward_bytes": max(after_blocks, -freeable),
        "checkpoint_bytes": rng_state_bytes,
    }
    return profiles, model, tail


@dataclass
class _ProfileStep:
    blocks: list[BlockProfile]
    start_bytes: int  # live when the forward started: parameters, the batch
    stem_bytes: int  # added between the forward's start and the first block
    peak_bytes: int  # the forward-and-backward peak
    optimizer_peak_bytes: int
    optimizer: torch.optim.Optimizer
    blocks_backward_live: int | None = None  # live when the last block's output gradient arrived
    tail_top: int | None = None  # the most live bytes after the blocks' backward, if any
    side_freed_bytes: int = 0  # the blocks' other arguments, freed by the end of forward


def _profile_step(
    spec: ExperimentSpec, dev: torch.device, meter: Meter, built: Built, fake: FakeRun | None = None
) -> _ProfileStep:
    """One un-checkpointed step with every block recorded
    (:class:`ckptlab.worker.engine.block_profile.BlockRecorder`; on fake tensors with
    ``fake``'s clock and optimizer)."""
    probe = meter.probe
    opt = make_optimizer(spec, list(built.module.parameters()), foreach=fake.foreach if fake else None)
    autocast = autocast_for(spec, dev)
    x, y = built.make_batch(spec.batch_size, torch.Generator().manual_seed(spec.seed))
    x, y = x.to(dev), y.to(dev)
    if spec.grad_accum_steps > 1:  # the micro-batches after the first run with every gradient alive: record one
        with autocast():
            out = built.module(x)
        (built.loss_fn(out, y) / spec.grad_accum_steps).backward()
        del out
    meter.sync()
    probe.reset_peak()
    start = probe.live_bytes
    clock = fake.clock if fake is not None else time.perf_counter
    early_stop = not spec.checkpoint.use_reentrant  # a reentrant checkpoint recomputes the whole segment
    with BlockRecorder(built.blocks, meter, tail=True, clock=clock, recompute=early_stop) as recorder:
        with autocast():
            out = built.module(x)
        loss = built.loss_fn(out, y) / spec.grad_accum_steps
        recorder.stop_forward()
        loss.backward()
        meter.sync()
        fb_peak = probe.peak_bytes  # the probe keeps the top of the recorder's windows
        recorder.finish_backward()
    del out, loss, x, y
    probe.reset_peak()
    opt.step()
    meter.sync()
    opt_peak = probe.peak_bytes
    opt.zero_grad(set_to_none=True)
    blocks = recorder.profiles()
    stem = (recorder.first_live if recorder.first_live is not None else start) - start
    return _ProfileStep(
        blocks,
        start,
        stem,
        fb_peak,
        opt_peak,
        opt,
        recorder.blocks_backward_live,
        recorder.tail_top,
        recorder.side_freed_bytes,
    )
