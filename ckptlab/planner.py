"""The checkpointing plan for a memory budget: which blocks of a chain to recompute.

Given each block's profile (bytes it keeps for backward, bytes of its input, forward time,
all measured by the engine), :func:`plan_chain` chooses contiguous segments to checkpoint so
that the recomputation time (the forward time of the checkpointed blocks) is minimal and the
predicted peak stays under the budget. Exact dynamic programming over segment boundaries
and the bytes retained so far, after Chen et al. 2016 §4 (arXiv 1604.06174) and Rotor
(Beaumont et al. 2019, "Optimal checkpointing for heterogeneous chains", Inria hal-02352969),
restricted to PyTorch's non-reentrant ``checkpoint`` (a checkpointed segment keeps its input
and is recomputed once during backward).

The memory model (bytes; ``F`` = what is alive throughout: parameters, optimizer state,
the batch, the stem's activations; Rotor's model, each block's temporaries measured):

- After forward, an un-checkpointed block ``i`` keeps ``retained_bytes[i]`` (the bytes it
  created that are still alive right after its forward, its output included). A
  checkpointed segment ``[s, e)`` keeps its input (already counted: the output of what came
  before) and its output, ``output_bytes[e - 1]``, which the next block saves or the next
  checkpoint keeps, plus ``checkpoint_bytes`` (the RNG state). (The first version of this
  model forgot that output when an un-checkpointed block followed, and under-predicted by
  up to 30%: issue 21.)
- A block's forward (and its recomputation) holds ``forward_bytes`` of temporaries on top
  of what it keeps.
- Backward runs the segments in reverse. Segment ``k`` is recomputed whole when its
  backward starts (non-reentrant checkpoint), with the gradient of its output waiting; then
  block ``j``'s backward holds everything the earlier segments keep, the retained bytes of
  its own segment up to ``j`` less ``released_bytes``, the gradients of the later blocks'
  parameters (``param_bytes``), the gradient of its output and ``backward_bytes``; and all
  along, what the part after the blocks leaves alive (:func:`plan_chain`'s ``backward_bytes``).
- At the end of forward the part after the blocks holds ``head_bytes``, calibrated on the
  un-checkpointed profile step so that the model predicts that step's peak.
- Predicted peak = ``max(F + max(every term above), floor)``; the floor (the optimizer
  step's own peak, the stem's backward) is the same under every plan.

Time: blocks that are the same computation (every measured byte count equal, as the layers
of a transformer or the blocks of a ResNet stage) take the median of their measured forward
times (:func:`pooled_forward_times`): one timed forward each on a busy host differs by noise
alone, and the program would otherwise trade recomputing one block for another on that
noise. Among plans of equal recomputation time the one with the fewest checkpointed segments
wins: each ``checkpoint`` call costs a little beyond its recomputation (measured on the
bench's ResNet generator, 4 blocks recomputed as 3 checkpoints: +24% step time against +20%
as one; docs/benchmarks.md), a cost this model does not count.

Pure Python, no torch: the engine profiles, this module decides.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from functools import cache

__all__ = [
    "BlockProfile",
    "Segment",
    "ChainPlan",
    "predict_peak",
    "kept_after_forward",
    "recompute_ms",
    "pooled_forward_times",
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
        input_bytes: bytes of the block's input tensor.
        forward_ms: forward time of the block (what recomputing it costs), ms.
        output_bytes: bytes of the block's output (what a checkpointed segment ending here
            keeps); None: the same as ``input_bytes`` (a shape-preserving block).
        param_bytes: bytes of the gradients of the block's parameters (default 0).
        backward_bytes: the most bytes the block's backward adds above what is alive when
            the gradient of its output arrives: its parameters' gradients, the gradient it
            passes on, temporaries (default 0).
        forward_bytes: the most bytes the block's forward holds above what it keeps at
            its end: temporaries it frees before returning (default 0). A recomputation
            holds them again, on top of everything alive in backward.
        released_bytes: bytes of ``retained_bytes`` already freed when the gradient of the
            block's output arrives (default 0): its output, when only what comes after
            (the next block, the head) saved it, and that backward ran first.
    """

    retained_bytes: int
    input_bytes: int
    forward_ms: float
    output_bytes: int | None = None
    param_bytes: int = 0
    backward_bytes: int = 0
    forward_bytes: int = 0
    released_bytes: int = 0

    @property
    def out_bytes(self) -> int:
        """``output_bytes``, or ``input_bytes`` when not given."""
        return self.input_bytes if self.output_bytes is None else self.output_bytes


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


def _activation_peak(
    blocks: Sequence[BlockProfile], segments: Sequence[Segment], head: int = 0, backward: int = 0, ckpt: int = 0
) -> int:
    """The plan's peak above ``F + c``: the bytes kept after forward plus ``head`` (what the
    part after the blocks holds then), or the most that one block's backward holds (see the
    module's memory model), plus ``backward`` (gradients outside the blocks) while the
    blocks run backward."""
    n = len(blocks)
    grads_after = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        grads_after[i] = grads_after[i + 1] + blocks[i].param_bytes
    kept_before, peak = 0, 0
    for seg in segments:
        alive = kept_before
        incoming = grads_after[seg.end] + blocks[seg.end - 1].out_bytes + backward
        for i in range(seg.start, seg.end):  # recomputed (or kept) up to block i
            b = blocks[i]
            peak = max(peak, alive + b.retained_bytes + b.forward_bytes)  # its forward
            if seg.checkpointed:  # its recomputation, the gradient of the segment's output waiting
                peak = max(peak, alive + b.retained_bytes + b.forward_bytes + incoming)
            alive += b.retained_bytes
            peak = max(peak, alive + _backward_extra(blocks, i, grads_after) + backward)
        kept_before = kept_before + blocks[seg.end - 1].out_bytes + ckpt if seg.checkpointed else alive
    return max(peak, kept_before + head)


def _backward_extra(blocks: Sequence[BlockProfile], i: int, grads_after: Sequence[int]) -> int:
    """What block ``i``'s backward holds besides the kept bytes: the gradients of later
    blocks, the gradient of its output, and what its backward adds, less what of its kept
    bytes is already freed (``released_bytes``; at most its output, so never negative)."""
    b = blocks[i]
    return grads_after[i + 1] + b.out_bytes + b.backward_bytes - b.released_bytes


def kept_after_forward(
    blocks: Sequence[BlockProfile], segments: Sequence[Segment], *, checkpoint_bytes: int = 0
) -> int:
    """The bytes the blocks keep at the end of forward under ``segments``: every
    un-checkpointed block's ``retained_bytes``, each checkpointed segment's output and
    ``checkpoint_bytes`` (see the module's memory model)."""
    kept = 0
    for seg in segments:
        if seg.checkpointed:
            kept += blocks[seg.end - 1].out_bytes + checkpoint_bytes
        else:
            kept += sum(b.retained_bytes for b in blocks[seg.start : seg.end])
    return kept


def predict_peak(
    blocks: Sequence[BlockProfile],
    segments: Sequence[Segment],
    *,
    fixed_bytes: int = 0,
    calibration_bytes: int = 0,
    head_bytes: int = 0,
    backward_bytes: int = 0,
    checkpoint_bytes: int = 0,
) -> int:
    """The predicted peak allocated bytes of ``segments`` (see the module's memory model;
    ``head_bytes`` counts at the end of forward only, ``backward_bytes`` while the blocks
    run backward)."""
    return (
        fixed_bytes
        + calibration_bytes
        + _activation_peak(blocks, segments, head_bytes, backward_bytes, checkpoint_bytes)
    )


def recompute_ms(blocks: Sequence[BlockProfile], segments: Sequence[Segment]) -> float:
    """Forward time of the checkpointed blocks, ms: what the plan adds to a step."""
    return sum(b.forward_ms for s in segments if s.checkpointed for b in blocks[s.start : s.end])


def pooled_forward_times(blocks: Sequence[BlockProfile]) -> list[BlockProfile]:
    """``blocks`` with each group of identical blocks (every field but ``forward_ms`` equal)
    given the median of the group's forward times, ms; other blocks unchanged. A block's
    forward is timed once in the profile step, and identical blocks differ there by noise
    only (see the module docstring)."""
    key_fields = [f.name for f in fields(BlockProfile) if f.name != "forward_ms"]
    groups: dict[tuple, list[float]] = {}
    for b in blocks:
        groups.setdefault(tuple(getattr(b, k) for k in key_fields), []).append(b.forward_ms)
    return [replace(b, forward_ms=statistics.median(groups[tuple(getattr(b, k) for k in key_fields)])) for b in blocks]


def _checkpoints(segments: Sequence[Segment]) -> int:
    return sum(s.checkpointed for s in segments)


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


def _plan(
    blocks: Sequence[BlockProfile],
    segments: Sequence[Segment],
    fixed: int,
    calib: int,
    head: int = 0,
    bwd: int = 0,
    ckpt: int = 0,
) -> ChainPlan:
    return ChainPlan(
        segments=tuple(segments),
        checkpointed_blocks=tuple(i for s in segments if s.checkpointed for i in range(s.start, s.end)),
        recompute_ms=recompute_ms(blocks, segments),
        predicted_peak_bytes=predict_peak(
            blocks,
            segments,
            fixed_bytes=fixed,
            calibration_bytes=calib,
            head_bytes=head,
            backward_bytes=bwd,
            checkpoint_bytes=ckpt,
        ),
    )


def _solve(
    blocks: Sequence[BlockProfile], limit: int, unit: int, head: int = 0, backward: int = 0, ckpt: int = 0
) -> tuple[Segment, ...] | None:
    """Segments with the least recomputation whose activation peak (:func:`_activation_peak`)
    is at most ``limit``; on equal recomputation, the fewest checkpointed segments.

    Dynamic program ``f(i, m)``: least recomputation for blocks ``i..n-1`` when the blocks
    before ``i`` keep ``m`` units of ``unit`` bytes (rounded up, so a found plan is
    feasible for the exact bytes too). Transitions: block ``i`` alone un-checkpointed, or a
    checkpointed segment ``[i, j)``; each checks its own backward peak, which depends only on
    ``m`` and the blocks from ``i`` on. ``O(n^2 * limit / unit)``.
    """
    n = len(blocks)
    prefix = [0]
    for b in blocks:
        prefix.append(prefix[-1] + b.retained_bytes)
    times = [0.0]
    for b in blocks:
        times.append(times[-1] + b.forward_ms)
    grads_after = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        grads_after[i] = grads_after[i + 1] + blocks[i].param_bytes
    budget_units = limit // unit

    def units(nbytes: int) -> int:
        return -(-nbytes // unit)

    def better(cost: float, calls: int, best: tuple[float, int, tuple[Segment, ...]] | None) -> bool:
        return best is None or cost < best[0] - 1e-9 or (cost <= best[0] + 1e-9 and calls < best[1])

    @cache
    def f(i: int, m: int) -> tuple[float, int, tuple[Segment, ...]] | None:
        if i == n:
            return (0.0, 0, ()) if m + units(head) <= budget_units else None
        best: tuple[float, int, tuple[Segment, ...]] | None = None
        # block i run normally: it keeps its activations (also during its backward)
        kept = units(blocks[i].retained_bytes)
        holds = max(units(blocks[i].forward_bytes), units(_backward_extra(blocks, i, grads_after) + backward))
        if m + kept + holds <= budget_units:
            rest = f(i + 1, m + kept)
            if rest is not None:
                best = (rest[0], rest[1], (Segment(i, i + 1, False), *rest[2]))
        worst = 0  # the most a block of the segment [i, j) holds in backward, above m
        forward_worst = 0  # the most a block's forward holds above m, recomputation aside
        for j in range(i + 1, n + 1):
            k = j - 1
            before_k = units(prefix[k] - prefix[i]) + units(blocks[k].retained_bytes + blocks[k].forward_bytes)
            forward_worst = max(forward_worst, before_k)
            worst = max(worst, units(prefix[j] - prefix[i]) + units(_backward_extra(blocks, k, grads_after) + backward))
            if m + max(worst, forward_worst) > budget_units:
                break  # longer segments only hold more
            incoming = units(grads_after[j] + blocks[k].out_bytes + backward)
            if m + forward_worst + incoming > budget_units:
                continue
            rest = f(j, m + units(blocks[k].out_bytes + ckpt))
            if rest is None:
                continue
            cost = times[j] - times[i] + rest[0]
            if better(cost, rest[1] + 1, best):
                best = (cost, rest[1] + 1, (Segment(i, j, True), *rest[2]))
        return best

    depth = sys.getrecursionlimit()
    sys.setrecursionlimit(max(depth, 4 * n + 200))  # f recurses once per block
    try:
        found = f(0, 0)
    finally:
        sys.setrecursionlimit(depth)
        f.cache_clear()
    return None if found is None else _merge(found[2])


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
    head_bytes: int = 0,
    backward_bytes: int = 0,
    checkpoint_bytes: int = 0,
    resolution: int = 1024,
) -> ChainPlan:
    """The plan with the least recomputation whose predicted peak is at most ``budget_bytes``.

    Args:
        blocks: the chain's block profiles, in order (at least one).
        budget_bytes: the memory budget for the peak allocated bytes.
        fixed_bytes: what is alive throughout forward and backward: parameters, optimizer
            state, the batch, the stem's activations (default 0).
        calibration_bytes: a constant added everywhere (default 0).
        head_bytes: what the part after the blocks (head, loss, their first gradients)
            holds at the end of forward, when every block's kept bytes are alive too
            (default 0).
        backward_bytes: what is alive while the blocks run backward besides the blocks'
            own bytes: what the part after them leaves (its parameters' gradients, the
            output the caller holds; default 0).
        checkpoint_bytes: what each checkpoint keeps besides its input, from its forward
            to its backward: the RNG state with ``preserve_rng_state`` (default 0).
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
    blocks = pooled_forward_times(blocks)
    extra = {"head": head_bytes, "bwd": backward_bytes, "ckpt": checkpoint_bytes}
    model = (head_bytes, backward_bytes, checkpoint_bytes)
    limit = budget_bytes - fixed_bytes - calibration_bytes
    if limit > 0:
        unit = max(1, math.ceil(limit / resolution))
        found = _solve(blocks, limit, unit, *model)
        # The uniform splits are checked with exact bytes too, so that rounding never makes
        # the plan cost more than the best checkpoint_sequential setting that fits.
        options = [found] if found is not None else []
        options += [sequential_segments(len(blocks), k) for k in range(1, len(blocks) + 1)]
        if found is None:  # near the smallest peak, rounding may hide the one plan that fits
            smallest = smallest_peak_plan(
                blocks, head_bytes=head_bytes, backward_bytes=backward_bytes, checkpoint_bytes=checkpoint_bytes
            )
            options.append(smallest.segments)
        fitting = [
            _plan(blocks, segs, fixed_bytes, calibration_bytes, **extra)
            for segs in options
            if _activation_peak(blocks, segs, *model) <= limit
        ]
        if fitting:
            return min(
                fitting,
                key=lambda p: (
                    round(p.recompute_ms, 6),
                    _checkpoints(p.segments),
                    p.predicted_peak_bytes,
                    len(p.checkpointed_blocks),
                ),
            )
    raise NoPlanFits(
        smallest_peak_plan(
            blocks,
            fixed_bytes=fixed_bytes,
            calibration_bytes=calibration_bytes,
            head_bytes=head_bytes,
            backward_bytes=backward_bytes,
            checkpoint_bytes=checkpoint_bytes,
        ),
        fixed_bytes=fixed_bytes,
        budget_bytes=budget_bytes,
    )


def smallest_peak_plan(
    blocks: Sequence[BlockProfile],
    *,
    fixed_bytes: int = 0,
    calibration_bytes: int = 0,
    head_bytes: int = 0,
    backward_bytes: int = 0,
    checkpoint_bytes: int = 0,
) -> ChainPlan:
    """The plan with the smallest predicted peak (the least recomputation among those).

    Bisection on the activation limit with :func:`plan_chain`'s program (feasibility is
    monotone in the limit), to 1/1024 of the un-checkpointed activation peak.
    """
    blocks = pooled_forward_times(blocks)
    n = len(blocks)
    model = (head_bytes, backward_bytes, checkpoint_bytes)
    hi = _activation_peak(blocks, (Segment(0, n, False),), *model)
    lo = 0
    unit = max(1, math.ceil(hi / 1024))
    best = _solve(blocks, hi, unit, *model) or (Segment(0, n, False),)
    while hi - lo > unit:
        mid = (lo + hi) // 2
        found = _solve(blocks, mid, unit, *model)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
    return _plan(blocks, best, fixed_bytes, calibration_bytes, *model)
