"""The planner's front (ckptlab/planning/front.py): from the smallest reachable peak to the
un-checkpointed one, each point the plan the planner chooses at its budget, none dominated;
and other plans of the same chain under the same model."""

from __future__ import annotations

import pytest

from ckptlab.planning.chain import (
    BlockProfile,
    Segment,
    pooled_forward_times,
    predict_peak,
    recompute_ms,
    sequential_segments,
)
from ckptlab.planning.front import plan_front, predicted_plans, segments_from_ranges
from ckptlab.planning.planner import plan_chain, smallest_peak_plan

BLOCKS = [BlockProfile(1000, 250, 1.0 + 0.1 * i, param_bytes=10, backward_bytes=300) for i in range(8)]
MODEL = {"fixed_bytes": 50_000, "head_bytes": 400, "backward_bytes": 100, "checkpoint_bytes": 5}


def test_the_front_runs_from_the_smallest_peak_to_no_checkpointing_and_no_point_is_dominated():
    front = plan_front(BLOCKS, points=16, **MODEL)
    assert len(front) >= 3
    budgets = [b for b, _ in front]
    assert budgets == sorted(budgets)
    smallest = smallest_peak_plan(BLOCKS, **MODEL)
    assert front[0][1].predicted_peak_bytes == smallest.predicted_peak_bytes == budgets[0]
    assert front[-1][1].checkpointed_blocks == ()
    for (budget, plan), (_, later) in zip(front, front[1:], strict=False):
        assert plan.predicted_peak_bytes <= budget
        assert later.recompute_ms < plan.recompute_ms  # more memory buys less recomputation
        assert later.predicted_peak_bytes > plan.predicted_peak_bytes
    for budget, plan in front:  # each point is the planner's own choice at its budget
        assert plan == plan_chain(BLOCKS, budget_bytes=budget, **MODEL)


def test_no_point_of_the_front_is_under_the_floor():
    floor = plan_front(BLOCKS, **MODEL)[1][1].predicted_peak_bytes
    front = plan_front(BLOCKS, floor_bytes=floor, **MODEL)
    assert all(b >= floor and p.predicted_peak_bytes >= floor for b, p in front)
    with pytest.raises(ValueError):
        plan_front(BLOCKS, points=1)


def test_other_plans_are_predicted_under_the_same_model():
    splits = {"per block": tuple(Segment(i, i + 1, True) for i in range(8)), "half": sequential_segments(8, 2)}
    plans = predicted_plans(BLOCKS, splits, **MODEL)
    assert plans["per block"].checkpointed_blocks == tuple(range(8))
    assert plans["half"].checkpointed_blocks == (0, 1, 2, 3)
    for name, plan in plans.items():
        assert plan.segments == splits[name]
        assert plan.predicted_peak_bytes == predict_peak(BLOCKS, plan.segments, **MODEL)
        # identical blocks at their median time, as the planner times them
        assert plan.recompute_ms == pytest.approx(recompute_ms(pooled_forward_times(BLOCKS), plan.segments))
    assert predicted_plans(BLOCKS, splits, floor_bytes=10**9)["half"].predicted_peak_bytes == 10**9


def test_a_strategy_s_ranges_become_the_chain_s_segments():
    assert segments_from_ranges(6, [(1, 3), (3, 4)]) == (
        Segment(0, 1, False),
        Segment(1, 3, True),
        Segment(3, 4, True),
        Segment(4, 6, False),
    )
    assert segments_from_ranges(4, []) == (Segment(0, 4, False),)
    with pytest.raises(ValueError):
        segments_from_ranges(4, [(2, 3), (1, 2)])
