"""What ``auto`` measures of the profiled copy apart from its profile step (issue 31): the
blocks' recomputation times, timed as the paired timing pass times a step
(:func:`ckptlab.worker.engine.block_timing.time_chain`), and each block checkpointed under
the selective policies worth measuring
(:func:`ckptlab.worker.engine.blocks.selective.measure_selective`), its bytes on the run's
meter and its time in the same timing pass.

Example usage (what :func:`ckptlab.worker.engine.autoplan.plan_for_budget` does)::

    profiles, timing, why_not = measured_apart(spec, dev, built, meter, optimizer, profiles)
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ckptlab.planning.chain import BlockProfile
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.worker.engine.block_timing import ChainTimes, time_chain
from ckptlab.worker.engine.blocks.selective import measure_selective, with_selective
from ckptlab.worker.measure.meter import Meter
from ckptlab.worker.models.base import Built

__all__ = ["measured_apart", "timed"]


def measured_apart(
    spec: ExperimentSpec,
    dev: torch.device,
    built: Built,
    meter: Meter,
    optimizer: torch.optim.Optimizer,
    profiles: list[BlockProfile],
) -> tuple[list[BlockProfile], ChainTimes | None, str | None]:
    """``profiles`` with the planner's recomputation times (:func:`timed`) and each block
    under the selective policies worth measuring
    (:func:`ckptlab.worker.engine.blocks.selective.measure_selective`: bytes on ``meter``,
    times in the same timing pass), the timing, and why there is none (or None)."""
    selective = measure_selective(spec, dev, built, meter)
    policies = sorted({m.policy for found in selective or () for m in found})
    timing, timing_error = timed(spec, dev, built, optimizer, policies)
    if timing is not None:
        times = zip(profiles, timing.forward_ms(), timing.last_ms(), strict=True)
        profiles = [replace(b, forward_ms=ms, last_forward_ms=last) for b, ms, last in times]
        profiles = with_selective(profiles, selective, {p: timing.policy_ms(p) for p in policies})
    return profiles, timing, timing_error


def timed(
    spec: ExperimentSpec, dev: torch.device, built: Built, optimizer: torch.optim.Optimizer, policies: list[str]
) -> tuple[ChainTimes | None, str | None]:
    """:func:`ckptlab.worker.engine.block_timing.time_chain` of the profiled copy, or None
    and why when a block cannot run apart from the model's forward or the un-checkpointed
    step does not fit (``torch.OutOfMemoryError``; the planner then keeps the profile step's
    times).

    Known limitation: on CUDA the timing's un-checkpointed steps stay in the allocator's
    cache, so the run's reserved peak reads the un-checkpointed run's (an H200: 3,828 MiB
    against 3,326 MiB without the timing, issue 31). Emptying the cache here brought it
    back but put the measured allocated peak 8.5 MiB over the plan's prediction (1.5 MiB
    without), presumably cuBLAS workspaces made again inside the run: not done."""
    try:
        return time_chain(spec, dev, built, optimizer, policies=policies), None
    except (RuntimeError, TypeError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
