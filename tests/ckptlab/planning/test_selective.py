"""Selective checkpoints in the planner (issue 31): per block keep, recompute all, or recompute
all but the matmul (and attention) outputs. The program is exact on small chains (brute
force over every plan, selective choices included), a budget between whole-block steps is
met with a selective block where that is cheapest, refusals stay exact, and the front and
the other plans carry the selective choices."""

from __future__ import annotations

import itertools
import random

import pytest

from ckptlab.planning.chain import SelectiveProfile, activation_peak, kept_after_forward
from ckptlab.planning.front import plan_front, predicted_plans
from ckptlab.planning.planner import (
    BlockProfile,
    NoPlanFits,
    Segment,
    least_activation_peak,
    plan_chain,
    predict_peak,
    recompute_ms,
    smallest_peak_plan,
)
from tests.ckptlab.planning.test_planner import extras

POLICIES = ("save_matmuls_and_attention", "save_matmuls")


def every_plan(blocks: list[BlockProfile]):
    """Every plan of the chain: consecutive segments, each run normally or checkpointed, and
    every one-block checkpointed segment also under each policy measured for its block."""
    n = len(blocks)
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *[i + 1 for i, c in enumerate(cuts) if c], n]
        pieces = list(zip(bounds, bounds[1:], strict=False))
        choices = []
        for s, e in pieces:
            options = [Segment(s, e, False), Segment(s, e, True)]
            if e - s == 1:
                options += [Segment(s, e, True, p) for p in blocks[s].policies]
            choices.append(options)
        yield from itertools.product(*choices)


def chain(n: int, seed: int) -> list[BlockProfile]:
    """``n`` random blocks, each with zero to two selective policies measured."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        retained, out_bytes = rng.randint(100, 400), rng.randint(10, 100)
        selective = tuple(
            SelectiveProfile(
                p,
                kept_bytes=rng.randint(out_bytes, retained),
                forward_bytes=rng.randint(0, 150),
                backward_bytes=rng.randint(0, 300),
                ms=rng.uniform(0.1, 2.0),
            )
            for p in POLICIES[: rng.randint(0, 2)]
        )
        out.append(
            BlockProfile(
                retained,
                rng.randint(10, 100),
                rng.uniform(0.5, 3.0),
                output_bytes=out_bytes,
                param_bytes=rng.randint(0, 60),
                backward_bytes=rng.randint(0, 200),
                forward_bytes=rng.randint(0, 200),
                released_bytes=rng.choice([0, out_bytes]),
                recompute_bytes=rng.randint(0, retained),
                last_forward_ms=rng.uniform(0.2, 1.0),
                policy_profiles=selective,
            )
        )
    return out


@pytest.mark.parametrize("seed", range(40))
def test_with_selective_choices_the_plan_is_the_cheapest_that_fits_and_refusals_are_exact(seed):
    blocks, model = chain(1 + seed % 5, seed), extras(seed)
    peaks = {p: predict_peak(blocks, p, **model) for p in every_plan(blocks)}
    least = min(peaks.values())
    assert least_activation_peak(blocks, **model) == least
    assert smallest_peak_plan(blocks, **model).predicted_peak_bytes == least
    with pytest.raises(NoPlanFits) as refused:
        plan_chain(blocks, budget_bytes=least - 1, **model)
    assert refused.value.smallest.predicted_peak_bytes == least
    levels = sorted(set(peaks.values()))
    for budget in levels[:: max(1, len(levels) // 5)]:
        plan = plan_chain(blocks, budget_bytes=budget, resolution=10**9, **model)
        assert plan.predicted_peak_bytes == peaks[plan.segments] <= budget, seed
        cheapest = min(recompute_ms(blocks, p) for p, peak in peaks.items() if peak <= budget)
        assert plan.recompute_ms == pytest.approx(cheapest), seed


def test_a_budget_between_whole_block_steps_is_met_with_a_selective_block():
    # The probe's shape (docs/benchmarks.md): a block keeps 10.7 MB, 2.8 MB recomputed
    # (+5.1 pp), 8.1 MB under save_matmuls_and_attention (+2.1 pp).
    sel = SelectiveProfile(POLICIES[0], kept_bytes=8_100, forward_bytes=500, backward_bytes=3_000, ms=2.1)
    block = BlockProfile(10_700, 2_800, 5.1, backward_bytes=3_000, forward_bytes=500, policy_profiles=(sel,))
    blocks = [block] * 4
    keep_all = predict_peak(blocks, (Segment(0, 4, False),))
    one_recomputed = predict_peak(blocks, (Segment(0, 1, True), Segment(1, 4, False)))
    one_selective = predict_peak(blocks, (Segment(0, 1, True, POLICIES[0]), Segment(1, 4, False)))
    assert one_recomputed < one_selective < keep_all
    plan = plan_chain(blocks, budget_bytes=one_selective, resolution=10**9)  # bytes not rounded
    assert [s.policy for s in plan.segments if s.checkpointed] == [POLICIES[0]]
    assert plan.recompute_ms == pytest.approx(2.1) and plan.predicted_peak_bytes <= one_selective
    assert plan.checkpointed_blocks == tuple(s.start for s in plan.segments if s.policy)
    # Without the selective choice the same budget costs a whole block's recomputation.
    plain = [BlockProfile(10_700, 2_800, 5.1, backward_bytes=3_000, forward_bytes=500)] * 4
    assert plan_chain(plain, budget_bytes=one_selective, resolution=10**9).recompute_ms == pytest.approx(5.1)
    # Between two whole-block steps the front has a selective point.
    front = plan_front(blocks, points=24)
    assert any(s.policy for _, p in front for s in p.segments)
    assert all(a[1].recompute_ms > b[1].recompute_ms for a, b in zip(front, front[1:], strict=False))


def test_a_selective_block_counts_as_a_kept_block_with_its_policys_figures():
    sel = SelectiveProfile(POLICIES[1], kept_bytes=300, forward_bytes=40, backward_bytes=90, ms=0.7)
    block = BlockProfile(500, 50, 2.0, output_bytes=60, released_bytes=60, policy_profiles=(sel,))
    as_kept = BlockProfile(300, 50, 0.7, output_bytes=60, forward_bytes=40, backward_bytes=90)
    segments = (Segment(0, 1, True, POLICIES[1]), Segment(1, 2, False))
    assert activation_peak([block, block], segments) == activation_peak([as_kept, block], (Segment(0, 2, False),))
    assert kept_after_forward([block, block], segments, checkpoint_bytes=7) == 300 + 500
    assert recompute_ms([block, block], segments) == pytest.approx(0.7)
    assert block.under(POLICIES[1]) == as_kept
    with pytest.raises(KeyError):
        block.under(POLICIES[0])


def test_selective_segments_are_one_checkpointed_block_and_profiles_read_back_from_records():
    with pytest.raises(ValueError):
        Segment(0, 2, True, POLICIES[0])
    with pytest.raises(ValueError):
        Segment(0, 1, False, POLICIES[0])
    record = {"policy": POLICIES[0], "kept_bytes": 1, "forward_bytes": 2, "backward_bytes": 3, "ms": 0.5}
    block = BlockProfile(10, 5, 1.0, policy_profiles=[record])
    assert block.policy_profiles == (SelectiveProfile(**record),) and block.policies == (POLICIES[0],)


def test_other_plans_may_be_selective_too():
    blocks = chain(3, 7)
    blocks = [b if b.policies else BlockProfile(b.retained_bytes, b.input_bytes, 1.0) for b in blocks]
    splits = {
        "mixed": tuple(
            Segment(i, i + 1, True, b.policies[0]) if b.policies else Segment(i, i + 1, True)
            for i, b in enumerate(blocks)
        )
    }
    plan = predicted_plans(blocks, splits, fixed_bytes=1000)["mixed"]
    assert plan.predicted_peak_bytes == predict_peak(blocks, splits["mixed"], fixed_bytes=1000)
    assert plan.checkpointed_blocks == (0, 1, 2)
    assert plan.recompute_ms == pytest.approx(recompute_ms(blocks, splits["mixed"]))
