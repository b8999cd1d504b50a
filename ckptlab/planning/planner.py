"""The checkpointing plan for a memory budget: which blocks of a chain to recompute.

Given each block's profile (bytes it keeps for backward, bytes of its input, forward time,
all measured by the engine), :func:`plan_chain` chooses contiguous segments to checkpoint, and
single blocks to checkpoint under a selective policy where the engine measured one
(:class:`ckptlab.planning.chain.SelectiveProfile`: keep the matmul and attention outputs,
recompute the rest; issue 31), so
that the recomputation time (the forward time of the checkpointed blocks, each segment's
last block up to where its recomputation stops: :func:`ckptlab.planning.chain.recompute_ms`)
is minimal and the predicted peak stays under the budget. Exact dynamic programming over segment boundaries
and the bytes retained so far, after Chen et al. 2016 §4 (arXiv 1604.06174) and Rotor
(Beaumont et al. 2019, "Optimal checkpointing for heterogeneous chains", Inria hal-02352969),
restricted to PyTorch's non-reentrant ``checkpoint`` (a checkpointed segment keeps its input
and is recomputed once during backward).

The chain's memory and time model (what a split keeps, when, and what recomputing it
costs) is :mod:`ckptlab.planning.chain`'s; this module searches it. Among plans of equal
recomputation time the one with the fewest checkpointed segments wins (see there).

Pure Python, no torch: the engine profiles, this module decides.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from ckptlab.planning.chain import (
    BlockProfile,
    Segment,
    activation_peak,
    backward_extra,
    kept_after_forward,
    pooled_forward_times,
    predict_peak,
    recompute_ms,
    sequential_segments,
)

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
    "least_activation_peak",
    "sequential_segments",
    "NoPlanFits",
]


@dataclass(frozen=True)
class ChainPlan:
    """A plan: the chain cut into segments, and what it is predicted to cost.

    Attributes:
        segments: consecutive segments covering the chain in order.
        checkpointed_blocks: indices of the blocks that are recomputed during backward.
        recompute_ms: the recomputation of the checkpointed segments (the time the plan
            adds, :func:`ckptlab.planning.chain.recompute_ms`), ms.
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
                f"{list(smallest.checkpointed_blocks)}), above the budget of {budget_bytes} bytes: make the "
                "activations smaller (the batch, the input) or raise the budget"
            )
        super().__init__(self.reason)


def _checkpoints(segments: Sequence[Segment]) -> int:
    return sum(s.checkpointed for s in segments)


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
    """Segments with the least recomputation whose activation peak (:func:`ckptlab.planning.chain.activation_peak`)
    is at most ``limit``; on equal recomputation, the fewest checkpointed segments.

    Dynamic program ``f(i, m)``: least recomputation for blocks ``i..n-1`` when the blocks
    before ``i`` keep ``m`` units of ``unit`` bytes (rounded up, so a found plan is
    feasible for the exact bytes too). Transitions: block ``i`` alone un-checkpointed, block
    ``i`` alone a selective checkpoint under each policy measured for it (counted as an
    un-checkpointed block with its policy's figures: :meth:`ckptlab.planning.chain.BlockProfile.under`),
    or a checkpointed segment ``[i, j)``; each checks its own backward peak, which depends only on
    ``m`` and the blocks from ``i`` on. ``O(n^2 * limit / unit)``.
    """
    n = len(blocks)
    prefix = [0]
    for b in blocks:
        prefix.append(prefix[-1] + b.retained_bytes)
    times = [0.0]  # times[j] - times[i]: forward_ms of blocks i..j-1
    for b in blocks:
        times.append(times[-1] + b.forward_ms)
    grads_after = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        grads_after[i] = grads_after[i + 1] + blocks[i].param_bytes
    budget_units = limit // unit
    # each block under each of its measured policies, made once (not per state of f)
    selective = [[(policy, b.under(policy)) for policy in b.policies] for b in blocks]

    def units(nbytes: int) -> int:
        return -(-nbytes // unit)

    rng = units(ckpt)

    def better(cost: float, calls: int, best: tuple[float, int, tuple[Segment, ...]] | None) -> bool:
        return best is None or cost < best[0] - 1e-9 or (cost <= best[0] + 1e-9 and calls < best[1])

    @cache
    def f(i: int, m: int) -> tuple[float, int, tuple[Segment, ...]] | None:
        if i == n:
            return (0.0, 0, ()) if m + units(head) <= budget_units else None
        best: tuple[float, int, tuple[Segment, ...]] | None = None
        # block i run normally: it keeps its activations (also during its backward)
        kept = units(blocks[i].retained_bytes)
        holds = max(units(blocks[i].forward_bytes), units(backward_extra(blocks, i, grads_after) + backward))
        if m + kept + holds <= budget_units:
            rest = f(i + 1, m + kept)
            if rest is not None:
                best = (rest[0], rest[1], (Segment(i, i + 1, False), *rest[2]))
        for policy, q in selective[i]:  # block i a selective checkpoint: counted as run normally
            kept = units(q.retained_bytes)
            holds = max(units(q.forward_bytes), units(grads_after[i + 1] + q.out_bytes + q.backward_bytes + backward))
            if m + kept + holds <= budget_units:
                rest = f(i + 1, m + kept)
                if rest is not None and better(q.forward_ms + rest[0], rest[1] + 1, best):
                    best = (q.forward_ms + rest[0], rest[1] + 1, (Segment(i, i + 1, True, policy), *rest[2]))
        worst = 0  # the most a block of the segment [i, j) holds in backward, above m
        forward_worst = 0  # the most a block's forward holds above m, recomputation aside
        for j in range(i + 1, n + 1):
            k = j - 1
            # the recomputation of the segment's last block stops early (chain.BlockProfile)
            recompute_worst = max(forward_worst, units(prefix[k] - prefix[i]) + units(blocks[k].last_recompute_bytes))
            before_k = units(prefix[k] - prefix[i]) + units(blocks[k].retained_bytes + blocks[k].forward_bytes)
            forward_worst = max(forward_worst, before_k)
            worst = max(worst, units(prefix[j] - prefix[i]) + units(backward_extra(blocks, k, grads_after) + backward))
            # the segment's own RNG state is alive throughout it, the recomputation's beside it
            if m + rng + max(worst, forward_worst) > budget_units:
                break  # longer segments only hold more
            incoming = units(grads_after[j] + blocks[k].out_bytes + backward + ckpt)
            if m + rng + recompute_worst + incoming > budget_units:
                continue
            rest = f(j, m + units(blocks[k].out_bytes + ckpt))
            if rest is None:
                continue
            cost = times[k] - times[i] + blocks[k].end_ms + rest[0]  # the last block's recomputation stops early
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
            if activation_peak(blocks, segs, *model) <= limit
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

    The peak is exact (:func:`_least_peak`); among the plans at it, the one with the least
    recomputation that a bisection on the activation limit with :func:`plan_chain`'s
    program finds (feasibility is monotone in the limit, bytes rounded to 1/1024 of the
    un-checkpointed activation peak), else the exact program's own.
    """
    blocks = pooled_forward_times(blocks)
    n = len(blocks)
    model = (head_bytes, backward_bytes, checkpoint_bytes)
    least, exact = _least_peak(blocks, *model)
    hi = activation_peak(blocks, (Segment(0, n, False),), *model)
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
    # The bisection's plan has the least recomputation near the smallest peak but, its bytes
    # rounded, may lie up to a few units above it; the exact program's plan is at it.
    candidates = [p for p in (best, exact) if activation_peak(blocks, p, *model) <= least]
    chosen = min(candidates, key=lambda segs: (round(recompute_ms(blocks, segs), 6), _checkpoints(segs)))
    return _plan(blocks, chosen, fixed_bytes, calibration_bytes, *model)


def least_activation_peak(
    blocks: Sequence[BlockProfile], *, head_bytes: int = 0, backward_bytes: int = 0, checkpoint_bytes: int = 0
) -> int:
    """The smallest activation peak (:func:`ckptlab.planning.chain.activation_peak`, bytes,
    above the fixed memory and calibration) over every split of the chain, exactly
    (:func:`_least_peak`, ``O(n^2)``)."""
    return _least_peak(blocks, head_bytes, backward_bytes, checkpoint_bytes)[0]


def _least_peak(
    blocks: Sequence[BlockProfile], head: int = 0, backward: int = 0, ckpt: int = 0
) -> tuple[int, tuple[Segment, ...]]:
    """The smallest activation peak (:func:`ckptlab.planning.chain.activation_peak`, bytes)
    over every split of the chain, exactly, and a split that reaches it (among equal peaks
    the one whose own choices recompute least, then the fewest checkpoints).

    Every term of the peak past block ``i`` is the bytes kept before ``i`` plus what blocks
    ``i..n-1`` add, so ``h(i)``, the least such addition, needs no bytes in its state:
    ``h(n) = head``; ``h(i)`` = the least over block ``i`` run normally, block ``i`` as a
    selective checkpoint under each measured policy and every checkpointed segment
    ``[i, j)`` of ``max(its own terms, what it keeps + h(next))``.
    ``O(n^2)``, no rounding: the planner refuses a budget only when this peak is above it.
    """
    n = len(blocks)
    grads_after = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        grads_after[i] = grads_after[i + 1] + blocks[i].param_bytes
    # best[i] = (h(i), recomputation ms, checkpoints, segments)
    best: list[tuple[int, float, int, tuple[Segment, ...]]] = [(0, 0.0, 0, ())] * (n + 1)
    best[n] = (head, 0.0, 0, ())
    for i in range(n - 1, -1, -1):
        b = blocks[i]
        h, ms, calls, segs = best[i + 1]
        own = max(
            b.retained_bytes + b.forward_bytes, b.retained_bytes + backward_extra(blocks, i, grads_after) + backward
        )
        options = [(max(own, b.retained_bytes + h), ms, calls, (Segment(i, i + 1, False), *segs))]
        for policy in b.policies:  # a selective checkpoint of block i, counted as run normally
            q = b.under(policy)
            own = max(
                q.retained_bytes + q.forward_bytes,
                q.retained_bytes + grads_after[i + 1] + q.out_bytes + q.backward_bytes + backward,
            )
            seg = Segment(i, i + 1, True, policy)
            options.append((max(own, q.retained_bytes + h), ms + q.forward_ms, calls + 1, (seg, *segs)))
        kept = 0  # retained bytes of blocks i..k-1
        # the most a block's forward, its recomputation and its backward add above the segment's input
        forward_top = backward_top = recompute_top = None
        seg_ms = 0.0
        for j in range(i + 1, n + 1):
            k = j - 1
            c = blocks[k]
            last = kept + c.last_recompute_bytes  # the recomputation stops early in the last block
            recompute_top = last if forward_top is None else max(forward_top, last)
            top = kept + c.retained_bytes + c.forward_bytes
            forward_top = top if forward_top is None else max(forward_top, top)
            kept += c.retained_bytes
            top = kept + backward_extra(blocks, k, grads_after) + backward
            backward_top = top if backward_top is None else max(backward_top, top)
            last_ms = seg_ms + c.end_ms  # the segment [i, j): its last block's recomputation stops early
            seg_ms += c.forward_ms
            incoming = grads_after[j] + c.out_bytes + backward  # waiting while the segment is recomputed
            own = ckpt + max(forward_top, recompute_top + incoming + ckpt, backward_top)
            h, ms, calls, segs = best[j]
            options.append((max(own, c.out_bytes + ckpt + h), last_ms + ms, calls + 1, (Segment(i, j, True), *segs)))
        best[i] = min(options, key=lambda o: (o[0], round(o[1], 6), o[2]))
    peak, _, _, segments = best[0]
    return max(peak, 0), _merge(segments)
