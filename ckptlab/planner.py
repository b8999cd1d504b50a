"""The checkpointing plan for a memory budget: which blocks of a chain to recompute.

Given each block's profile (bytes it keeps for backward, bytes of its input, forward time,
all measured by the engine), :func:`plan_chain` chooses contiguous segments to checkpoint so
that the recomputation time (the forward time of the checkpointed blocks) is minimal and the
predicted peak stays under the budget. Exact dynamic programming over segment boundaries
and the bytes retained so far, after Chen et al. 2016 §4 (arXiv 1604.06174) and Rotor
(Beaumont et al. 2019, "Optimal checkpointing for heterogeneous chains", Inria hal-02352969),
restricted to PyTorch's non-reentrant ``checkpoint`` (a checkpointed segment keeps its input
and is recomputed once during backward).

The memory model (bytes; ``F`` = fixed memory: parameters, gradients, optimizer state;
``c`` = a calibration constant for what the model does not see: the batch, the loss, the
head, temporaries):

- After forward, an un-checkpointed block ``i`` keeps ``retained_bytes[i]`` (the bytes it
  created that are still alive at the end of an un-checkpointed forward). A checkpointed
  segment ``[s, e)`` keeps its input, which costs ``input_bytes[s]`` only when the block
  before it is checkpointed too (otherwise that block, or the stem, already keeps it).
- Backward runs the segments in reverse. Recomputing segment ``k`` brings back the
  ``retained_bytes`` of all its blocks while every earlier segment still holds what it kept.
- Predicted peak = ``F + c + max(kept after forward, max_k (kept by segments before k +
  retained by segment k))``.

The calibration ``c`` comes from the un-checkpointed run: measured peak minus ``F`` minus
the model's peak for "no checkpointing". Pure Python, no torch: the engine profiles, this
module decides.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

__all__ = [
    "BlockProfile",
    "Segment",
    "ChainPlan",
    "predict_peak",
    "recompute_ms",
    "plan_chain",
    "smallest_peak_plan",
    "sequential_segments",
    "NoPlanFits",
]


@dataclass(frozen=True)
class BlockProfile:
    """What one block of the chain costs, as measured by the engine.

    Attributes:
        retained_bytes: bytes the block keeps for backward when it is not checkpointed
            (live bytes after its forward minus before, the input excluded).
        input_bytes: bytes of the block's input tensor (what a checkpoint of a segment
            starting here keeps).
        forward_ms: forward time of the block (what recomputing it costs), ms.
    """

    retained_bytes: int
    input_bytes: int
    forward_ms: float


@dataclass(frozen=True)
class Segment:
    """Blocks ``start .. end - 1`` of the chain; ``checkpointed`` or run normally."""

    start: int
    end: int
    checkpointed: bool


@dataclass(frozen=True)
class ChainPlan:
    """A plan: the chain cut into segments, and what it is predicted to cost.

    Attributes:
        segments: consecutive segments covering the chain in order.
        checkpointed_blocks: indices of the blocks that are recomputed during backward.
        recompute_ms: forward time of the checkpointed blocks (the time the plan adds), ms.
        predicted_peak_bytes: the predicted peak allocated bytes (fixed memory and
            calibration included).
    """

    segments: tuple[Segment, ...]
    checkpointed_blocks: tuple[int, ...]
    recompute_ms: float
    predicted_peak_bytes: int


class NoPlanFits(ValueError):
    """No plan keeps the predicted peak under the budget.

    Attributes:
        smallest: the plan with the smallest predicted peak.
        fixed_bytes: the fixed memory (parameters, gradients, optimizer state).
        budget_bytes: the budget asked for.
        reason: why, in plain words.
    """

    def __init__(self, smallest: ChainPlan, *, fixed_bytes: int, budget_bytes: int):
        self.smallest, self.fixed_bytes, self.budget_bytes = smallest, fixed_bytes, budget_bytes
        if fixed_bytes >= budget_bytes:
            self.reason = (
                f"parameters, gradients and optimizer state alone need {fixed_bytes} bytes, more than the "
                f"budget of {budget_bytes} bytes: checkpointing cannot help; use a smaller model, an optimizer "
                "with less state (sgd) or a larger budget"
            )
        else:
            self.reason = (
                f"the smallest reachable peak is {smallest.predicted_peak_bytes} bytes (checkpointing blocks "
                f"{list(smallest.checkpointed_blocks)}), above the budget of {budget_bytes} bytes: lower the batch "
                "size or the sequence length"
            )
        super().__init__(self.reason)


def _activation_peak(blocks: Sequence[BlockProfile], segments: Sequence[Segment]) -> int:
    kept_before, peak, prev_checkpointed = 0, 0, False
    for seg in segments:
        full = sum(b.retained_bytes for b in blocks[seg.start : seg.end])
        peak = max(peak, kept_before + full)
        if seg.checkpointed:
            kept_before += blocks[seg.start].input_bytes if prev_checkpointed else 0
        else:
            kept_before += full
        prev_checkpointed = seg.checkpointed
    return max(peak, kept_before)


def predict_peak(
    blocks: Sequence[BlockProfile], segments: Sequence[Segment], *, fixed_bytes: int = 0, calibration_bytes: int = 0
) -> int:
    """The predicted peak allocated bytes of ``segments`` (see the module's memory model)."""
    return fixed_bytes + calibration_bytes + _activation_peak(blocks, segments)


def recompute_ms(blocks: Sequence[BlockProfile], segments: Sequence[Segment]) -> float:
    """Forward time of the checkpointed blocks, ms: what the plan adds to a step."""
    return sum(b.forward_ms for s in segments if s.checkpointed for b in blocks[s.start : s.end])


def sequential_segments(n: int, segments: int) -> tuple[Segment, ...]:
    """The split of ``torch.utils.checkpoint.checkpoint_sequential(functions, segments)``:
    ``n // segments`` blocks per segment, the first ``segments - 1`` checkpointed, the rest
    (the last segment) run normally.

    Raises:
        ValueError: ``segments`` outside ``1..n``.
    """
    if not 1 <= segments <= n:
        raise ValueError(f"segments must be in 1..{n}, got {segments}")
    size = n // segments
    out = [Segment(i * size, (i + 1) * size, True) for i in range(segments - 1)]
    out.append(Segment((segments - 1) * size, n, False))
    return tuple(out)


def _plan(blocks: Sequence[BlockProfile], segments: Sequence[Segment], fixed: int, calib: int) -> ChainPlan:
    return ChainPlan(
        segments=tuple(segments),
        checkpointed_blocks=tuple(i for s in segments if s.checkpointed for i in range(s.start, s.end)),
        recompute_ms=recompute_ms(blocks, segments),
        predicted_peak_bytes=predict_peak(blocks, segments, fixed_bytes=fixed, calibration_bytes=calib),
    )


def _solve(blocks: Sequence[BlockProfile], limit: int, unit: int) -> tuple[Segment, ...] | None:
    """Segments with the least recomputation whose activation peak is at most ``limit``.

    Dynamic program ``f(i, m, p)``: least recomputation for blocks ``i..n-1`` when the
    blocks before ``i`` keep ``m`` units of ``unit`` bytes (rounded up, so a found plan is
    feasible for the exact bytes too) and ``p`` says whether block ``i - 1`` is
    checkpointed. Transitions: block ``i`` alone un-checkpointed, or a checkpointed segment
    ``[i, j)``. ``O(n^2 * limit / unit)``.
    """
    n = len(blocks)
    kept = [b.retained_bytes for b in blocks]
    prefix = [0]
    for k in kept:
        prefix.append(prefix[-1] + k)
    times = [0.0]
    for b in blocks:
        times.append(times[-1] + b.forward_ms)
    budget_units = limit // unit

    def units(nbytes: int) -> int:
        return -(-nbytes // unit)

    @cache
    def f(i: int, m: int, prev_checkpointed: bool) -> tuple[float, tuple[Segment, ...]] | None:
        if i == n:
            return (0.0, ()) if m <= budget_units else None
        best: tuple[float, tuple[Segment, ...]] | None = None
        # block i run normally: it keeps its activations (also during its backward)
        if m + units(kept[i]) <= budget_units:
            rest = f(i + 1, m + units(kept[i]), False)
            if rest is not None:
                best = (rest[0], (Segment(i, i + 1, False), *rest[1]))
        keep = units(blocks[i].input_bytes) if prev_checkpointed else 0
        for j in range(i + 1, n + 1):
            if m + units(prefix[j] - prefix[i]) > budget_units:  # its recomputation would not fit
                break
            rest = f(j, m + keep, True)
            if rest is None:
                continue
            cost = times[j] - times[i] + rest[0]
            if best is None or cost < best[0] - 1e-12:
                best = (cost, (Segment(i, j, True), *rest[1]))
        return best

    depth = sys.getrecursionlimit()
    sys.setrecursionlimit(max(depth, 4 * n + 200))  # f recurses once per block
    try:
        found = f(0, 0, False)
    finally:
        sys.setrecursionlimit(depth)
        f.cache_clear()
    return None if found is None else _merge(found[1])


def _merge(segments: Sequence[Segment]) -> tuple[Segment, ...]:
    """Join neighbouring un-checkpointed segments (the same plan, fewer pieces)."""
    out: list[Segment] = []
    for s in segments:
        if out and not s.checkpointed and not out[-1].checkpointed:
            out[-1] = Segment(out[-1].start, s.end, False)
        else:
            out.append(s)
    return tuple(out)


def plan_chain(
    blocks: Sequence[BlockProfile],
    *,
    budget_bytes: int,
    fixed_bytes: int = 0,
    calibration_bytes: int = 0,
    resolution: int = 1024,
) -> ChainPlan:
    """The plan with the least recomputation whose predicted peak is at most ``budget_bytes``.

    Args:
        blocks: the chain's block profiles, in order (at least one).
        budget_bytes: the memory budget for the peak allocated bytes.
        fixed_bytes: parameters + gradients + optimizer state (default 0).
        calibration_bytes: the constant of the memory model (default 0).
        resolution: bytes are counted in ``activation budget / resolution`` units, rounded
            up (default 1024: a plan may be up to 1/1024 of the budget more conservative than
            the exact optimum; the time is optimal for the rounded sizes).

    Returns:
        The plan; ``segments`` is ``[Segment(0, n, False)]`` when nothing needs checkpointing.

    Raises:
        NoPlanFits: no plan fits; it carries the smallest-peak plan and the reason.
        ValueError: no blocks.
    """
    if not blocks:
        raise ValueError("a chain needs at least one block")
    limit = budget_bytes - fixed_bytes - calibration_bytes
    if limit > 0:
        unit = max(1, math.ceil(limit / resolution))
        found = _solve(blocks, limit, unit)
        # The uniform splits are checked with exact bytes too, so that rounding never makes
        # the plan cost more than the best checkpoint_sequential setting that fits.
        options = [found] if found is not None else []
        options += [sequential_segments(len(blocks), k) for k in range(1, len(blocks) + 1)]
        fitting = [
            _plan(blocks, segs, fixed_bytes, calibration_bytes)
            for segs in options
            if _activation_peak(blocks, segs) <= limit
        ]
        if fitting:
            return min(fitting, key=lambda p: (p.recompute_ms, p.predicted_peak_bytes, len(p.checkpointed_blocks)))
    raise NoPlanFits(
        smallest_peak_plan(blocks, fixed_bytes=fixed_bytes, calibration_bytes=calibration_bytes),
        fixed_bytes=fixed_bytes,
        budget_bytes=budget_bytes,
    )


def smallest_peak_plan(
    blocks: Sequence[BlockProfile], *, fixed_bytes: int = 0, calibration_bytes: int = 0
) -> ChainPlan:
    """The plan with the smallest predicted peak (the least recomputation among those).

    Bisection on the activation limit with :func:`plan_chain`'s program (feasibility is
    monotone in the limit), to 1/1024 of the un-checkpointed activation peak.
    """
    n = len(blocks)
    hi = _activation_peak(blocks, (Segment(0, n, False),))
    lo = 0
    unit = max(1, math.ceil(hi / 1024))
    best = _solve(blocks, hi, unit) or (Segment(0, n, False),)
    while hi - lo > unit:
        mid = (lo + hi) // 2
        found = _solve(blocks, mid, unit)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
    return _plan(blocks, best, fixed_bytes, calibration_bytes)
