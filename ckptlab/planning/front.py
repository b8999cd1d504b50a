"""The planner's trade-off as a whole: its front (the plan it chooses at budgets from the
smallest reachable peak to the un-checkpointed one) and other plans of the same chain (the
uniform strategies' settings: every block its own checkpoint, ``checkpoint_sequential``'s
splits), each predicted under the same memory model, so that a plan page can draw what
the planner predicted beside what was measured (issue 31).

Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ckptlab.planning.chain import (
    BlockProfile,
    Segment,
    activation_peak,
    pooled_forward_times,
    predict_peak,
    recompute_ms,
)
from ckptlab.planning.planner import ChainPlan, NoPlanFits, least_activation_peak, plan_chain

__all__ = ["plan_front", "predicted_plans", "segments_from_ranges"]


def plan_front(
    blocks: Sequence[BlockProfile],
    *,
    points: int = 12,
    floor_bytes: int = 0,
    fixed_bytes: int = 0,
    calibration_bytes: int = 0,
    head_bytes: int = 0,
    backward_bytes: int = 0,
    checkpoint_bytes: int = 0,
) -> list[tuple[int, ChainPlan]]:
    """The planner's front: the plan :func:`ckptlab.planning.planner.plan_chain` chooses
    at ``points`` budgets evenly spaced from the smallest reachable predicted peak
    (:func:`ckptlab.planning.planner.least_activation_peak`, exact) to the un-checkpointed
    one, as ``(budget, plan)``, lowest budget first. A plan that recomputes no less than
    the plan of a lower budget is left out: no faster and no smaller, it is dominated.
    Every predicted peak is at least ``floor_bytes`` (what no plan changes: the optimizer
    step's peak), and so is every budget. The plans' predicted peaks and recomputation
    times trace the trade-off the program sees (Rotor's time-memory front, Beaumont et al.
    2019), each optimal for its budget up to ``plan_chain``'s byte rounding (1/1024 of the
    activation budget). Other arguments as ``plan_chain``'s.

    Raises:
        ValueError: no blocks, or ``points`` below 2.
    """
    if not blocks or points < 2:
        raise ValueError("a front needs at least one block and two points")
    model = {"head_bytes": head_bytes, "backward_bytes": backward_bytes, "checkpoint_bytes": checkpoint_bytes}
    base = fixed_bytes + calibration_bytes
    pooled = pooled_forward_times(blocks)
    lo = max(base + least_activation_peak(pooled, **model), floor_bytes)
    top = activation_peak(pooled, (Segment(0, len(blocks), False),), head_bytes, backward_bytes, checkpoint_bytes)
    hi = max(base + top, lo)
    front: list[tuple[int, ChainPlan]] = []
    for budget in sorted({lo + (hi - lo) * j // (points - 1) for j in range(points)}):
        try:
            plan = plan_chain(
                blocks, budget_bytes=budget, fixed_bytes=fixed_bytes, calibration_bytes=calibration_bytes, **model
            )
        except NoPlanFits:
            continue
        if front and plan.recompute_ms >= front[-1][1].recompute_ms - 1e-9:
            continue  # no faster than the plan of a lower budget, and no smaller: not on the front
        if plan.predicted_peak_bytes < floor_bytes:
            plan = ChainPlan(plan.segments, plan.checkpointed_blocks, plan.recompute_ms, floor_bytes)
        front.append((budget, plan))
    return front


def segments_from_ranges(n: int, ranges: Sequence[tuple[int, int]]) -> tuple[Segment, ...]:
    """The chain of ``n`` blocks as segments: the half-open ``ranges`` checkpointed (a
    strategy's groups, :data:`ckptlab.strategies.Groups`), the blocks between them run
    normally, in order.

    Raises:
        ValueError: ranges that overlap, are out of order or outside ``0..n``.
    """
    out: list[Segment] = []
    at = 0
    for start, end in ranges:
        if not at <= start < end <= n:
            raise ValueError(f"ranges must be ordered, disjoint and within 0..{n}: {list(ranges)}")
        if start > at:
            out.append(Segment(at, start, False))
        out.append(Segment(start, end, True))
        at = end
    if at < n:
        out.append(Segment(at, n, False))
    return tuple(out)


def predicted_plans(
    blocks: Sequence[BlockProfile],
    splits: Mapping[str, Sequence[Segment]],
    *,
    floor_bytes: int = 0,
    **model: int,
) -> dict[str, ChainPlan]:
    """Each of ``splits`` (label -> the chain's segments: the uniform strategies' settings,
    e.g. ``checkpoint_sequential``'s :func:`ckptlab.planning.chain.sequential_segments`)
    as a plan under the planner's model: its predicted peak (bytes, at least
    ``floor_bytes``) and recomputation (ms, identical blocks pooled as the planner pools
    them). ``model``: the memory model's terms as :func:`ckptlab.planning.chain.predict_peak`
    takes them (``fixed_bytes``, ``calibration_bytes``, ``head_bytes``,
    ``backward_bytes``, ``checkpoint_bytes``; bytes, 0 when left out).

    Raises:
        ValueError: no blocks.
        TypeError: a keyword ``predict_peak`` does not take.
    """
    if not blocks:
        raise ValueError("a chain needs at least one block")
    pooled = pooled_forward_times(blocks)
    return {
        name: ChainPlan(
            tuple(segs),
            tuple(i for s in segs if s.checkpointed for i in range(s.start, s.end)),
            recompute_ms(pooled, segs),
            max(predict_peak(pooled, segs, **model), floor_bytes),
        )
        for name, segs in splits.items()
    }
