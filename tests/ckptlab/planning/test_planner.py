"""The budget planner: exact on small chains (brute force), never worse than the best
uniform ``checkpoint_sequential`` split that fits, never above the budget, and a clear
reason when nothing fits."""

from __future__ import annotations

import itertools
import random
import statistics
from dataclasses import replace

import pytest

from ckptlab.planning.chain import activation_peak
from ckptlab.planning.planner import (
    BlockProfile,
    NoPlanFits,
    Segment,
    plan_chain,
    pooled_forward_times,
    predict_peak,
    recompute_ms,
    sequential_segments,
    smallest_peak_plan,
)


def all_segmentations(n: int):
    """Every way to cut ``n`` blocks into consecutive segments, each checkpointed or not."""
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *[i + 1 for i, c in enumerate(cuts) if c], n]
        pieces = list(zip(bounds, bounds[1:], strict=False))
        for flags in itertools.product([False, True], repeat=len(pieces)):
            yield tuple(Segment(s, e, f) for (s, e), f in zip(pieces, flags, strict=True))


def chain(n: int, seed: int, *, early_stop: bool = False) -> list[BlockProfile]:
    """``n`` random block profiles; ``early_stop``: each with a ``recompute_bytes`` (at most
    its whole forward's top, as measured), drawn after the rest."""
    rng = random.Random(seed)
    blocks = [
        BlockProfile(
            rng.randint(50, 400),
            rng.randint(10, 100),
            rng.uniform(0.5, 3.0),
            output_bytes=rng.randint(10, 100),
            param_bytes=rng.randint(0, 60),
            backward_bytes=rng.randint(0, 200),
            forward_bytes=rng.randint(0, 200),
        )
        for _ in range(n)
    ]
    if early_stop:
        blocks = [replace(b, recompute_bytes=rng.randint(0, b.retained_bytes + b.forward_bytes)) for b in blocks]
    return blocks


def extras(seed: int) -> dict[str, int]:
    """Random ``head_bytes``, ``backward_bytes`` (negative too: issue 31's GPT-2) and
    ``checkpoint_bytes`` (the RNG state each checkpoint keeps)."""
    rng = random.Random(-seed)
    return {
        "head_bytes": rng.randint(0, 300),
        "backward_bytes": rng.randint(-40, 100),
        "checkpoint_bytes": rng.choice([0, 5, 50]),
    }


@pytest.mark.parametrize("seed", range(6))
def test_the_plan_is_the_cheapest_that_fits_by_brute_force(seed):
    blocks = chain(6, seed)
    none_peak = predict_peak(blocks, (Segment(0, 6, False),))
    for budget in (none_peak, int(none_peak * 0.7), int(none_peak * 0.45)):
        feasible = [s for s in all_segmentations(6) if predict_peak(blocks, s) <= budget]
        try:
            plan = plan_chain(blocks, budget_bytes=budget, resolution=100_000)
        except NoPlanFits:
            assert not feasible
            continue
        assert plan.predicted_peak_bytes <= budget
        assert plan.recompute_ms == pytest.approx(min(recompute_ms(blocks, s) for s in feasible))


def test_never_costlier_than_the_best_uniform_split_that_fits():
    blocks = [BlockProfile(1000, 250, 1.0) for _ in range(24)]
    fixed = 50_000
    for budget in range(fixed + 8_000, fixed + 26_000, 1_500):
        uniform = [
            sequential_segments(24, k)
            for k in range(1, 25)
            if predict_peak(blocks, sequential_segments(24, k), fixed_bytes=fixed) <= budget
        ]
        try:
            plan = plan_chain(blocks, budget_bytes=budget, fixed_bytes=fixed)
        except NoPlanFits:
            assert not uniform
            continue
        assert plan.predicted_peak_bytes <= budget
        if uniform:
            assert plan.recompute_ms <= min(recompute_ms(blocks, s) for s in uniform) + 1e-9


def test_no_checkpointing_when_everything_fits():
    blocks = chain(8, 1)
    plan = plan_chain(blocks, budget_bytes=10**9)
    assert plan.checkpointed_blocks == () and plan.recompute_ms == 0


def test_nothing_fits_names_the_fixed_memory_or_the_smallest_peak():
    blocks = [BlockProfile(1000, 100, 1.0) for _ in range(16)]
    with pytest.raises(NoPlanFits, match="optimizer state alone") as too_small:
        plan_chain(blocks, budget_bytes=10_000, fixed_bytes=20_000)
    assert too_small.value.smallest.predicted_peak_bytes > 20_000
    lowest = smallest_peak_plan(blocks, fixed_bytes=20_000)
    with pytest.raises(NoPlanFits, match="smallest reachable peak") as above:
        plan_chain(blocks, budget_bytes=lowest.predicted_peak_bytes - 500, fixed_bytes=20_000)
    assert above.value.smallest.predicted_peak_bytes == lowest.predicted_peak_bytes
    assert plan_chain(blocks, budget_bytes=lowest.predicted_peak_bytes + 10, fixed_bytes=20_000)


def test_sequential_segments_match_checkpoint_sequential():
    assert sequential_segments(10, 3) == (Segment(0, 3, True), Segment(3, 6, True), Segment(6, 10, False))
    assert sequential_segments(4, 1) == (Segment(0, 4, False),)
    with pytest.raises(ValueError):
        sequential_segments(4, 5)


def test_identical_blocks_are_timed_at_their_median_and_others_keep_their_own_time():
    same = dict(retained_bytes=300, input_bytes=50, param_bytes=20)
    blocks = [
        BlockProfile(forward_ms=1.0, **same),
        BlockProfile(forward_ms=1.6, **same),
        BlockProfile(retained_bytes=900, input_bytes=50, forward_ms=5.0),
        BlockProfile(forward_ms=1.1, **same),
    ]
    pooled = pooled_forward_times(blocks)
    assert [b.forward_ms for b in pooled] == [1.1, 1.1, 5.0, 1.1]
    assert [b.retained_bytes for b in pooled] == [300, 300, 900, 300]


def test_on_equal_recomputation_the_plan_uses_the_fewest_checkpoints():
    # Eight identical blocks timed with noise (as one timed forward each is on a busy host):
    # the budget of checkpoint_sequential's 3-segment split is met by one checkpoint of four
    # neighbours, not by two checkpoints around a block that the noise made look 5% dearer
    # (what bench_auto measured on the ResNet generator before: 4 blocks recomputed as 3
    # checkpoints, +24% step time against +20% as one).
    times = [1.01, 1.08, 1.13, 1.02, 0.95, 1.05, 1.08, 1.14]
    blocks = [BlockProfile(800, 50, t, param_bytes=10, backward_bytes=300) for t in times]
    budget = predict_peak(blocks, sequential_segments(8, 3))
    plan = plan_chain(blocks, budget_bytes=budget, resolution=100_000)
    assert plan.segments == (Segment(0, 4, True), Segment(4, 8, False))
    assert plan.recompute_ms == pytest.approx(4 * statistics.median(times))


def test_with_rng_states_a_negative_backward_and_early_stops_the_plan_is_still_the_cheapest_that_fits():
    # The program left the checkpoint's RNG states out of a segment's own terms and chose
    # plans the exact check then threw away (7 of these budgets, without the early stops).
    for seed in range(60):
        blocks, model = chain(1 + seed % 6, seed, early_stop=True), extras(seed)
        peaks = {s: predict_peak(blocks, s, **model) for s in all_segmentations(len(blocks))}
        for budget in sorted(set(peaks.values()))[:: max(1, len(set(peaks.values())) // 4)]:
            plan = plan_chain(blocks, budget_bytes=budget, resolution=10**9, **model)
            assert plan.predicted_peak_bytes == peaks[plan.segments] <= budget, seed
            cheapest = min(recompute_ms(blocks, s) for s, peak in peaks.items() if peak <= budget)
            assert plan.recompute_ms == pytest.approx(cheapest), seed


def test_a_budget_at_the_smallest_peak_is_planned_and_one_byte_less_is_refused():
    # Issue 31: the smallest peak came from a bisection on rounded bytes and that program,
    # a few bytes high, and a budget at the true one could be refused (22 of these chains,
    # without the early stops).
    for seed in range(120):
        blocks, model = chain(1 + seed % 6, seed, early_stop=True), extras(seed)
        least = min(predict_peak(blocks, s, **model) for s in all_segmentations(len(blocks)))
        assert smallest_peak_plan(blocks, **model).predicted_peak_bytes == least, seed
        assert plan_chain(blocks, budget_bytes=least, **model).predicted_peak_bytes <= least
        with pytest.raises(NoPlanFits) as refused:
            plan_chain(blocks, budget_bytes=least - 1, **model)
        assert refused.value.smallest.predicted_peak_bytes == least


def test_a_segments_last_block_is_recomputed_only_up_to_its_last_saved_tensor():
    # PyTorch's non-reentrant checkpoint stops the recomputation once the segment's last
    # saved tensor is back: the last block holds its recompute_bytes (60 of its 100 kept),
    # the blocks before it their whole forward. RNG state 5 B per checkpoint, 5 B more
    # while recomputing; the gradient of the segment's output (40 B) waits throughout.
    block = BlockProfile(100, 40, 1.0, backward_bytes=10, released_bytes=40)
    measured = replace(block, recompute_bytes=60)
    one = (Segment(0, 1, True),)
    assert activation_peak([block], one, ckpt=5) == 5 + 100 + 40 + 5  # counted whole: 150
    assert activation_peak([measured], one, ckpt=5) == 5 + 100 + 10  # its backward: 115
    two = (Segment(0, 2, True),)
    assert activation_peak([block, block], two, ckpt=5) == 5 + 100 + 100 + 40 + 5  # 250
    assert activation_peak([measured, measured], two, ckpt=5) == 5 + 100 + 100 + 10  # 215
    assert measured.last_recompute_bytes == 60 and block.last_recompute_bytes == 100


def test_a_segment_s_last_block_costs_its_early_stopped_recomputation_and_the_plan_is_still_the_cheapest():
    # Issue 31: a non-reentrant checkpoint stops recomputing a segment's last block after the
    # last tensor it saves (the built-in transformer's block skips its last 20% there): a
    # segment [s, e) costs the forwards of s .. e - 2 and last_forward_ms of e - 1.
    blocks = [BlockProfile(100, 50, 2.0, last_forward_ms=1.5) for _ in range(4)]
    assert recompute_ms(blocks, (Segment(0, 2, True), Segment(2, 4, False))) == pytest.approx(2.0 + 1.5)
    assert recompute_ms(blocks, tuple(Segment(i, i + 1, True) for i in range(4))) == pytest.approx(4 * 1.5)
    assert BlockProfile(100, 50, 2.0).end_ms == 2.0  # not measured: the whole forward
    for seed in range(40):
        rng = random.Random(seed)
        timed = [replace(b, last_forward_ms=rng.uniform(0.2, 1.0) * b.forward_ms) for b in chain(5, seed)]
        model = extras(seed)
        peaks = {s: predict_peak(timed, s, **model) for s in all_segmentations(5)}
        for budget in sorted(set(peaks.values()))[:: max(1, len(set(peaks.values())) // 4)]:
            plan = plan_chain(timed, budget_bytes=budget, resolution=10**9, **model)
            cheapest = min(recompute_ms(timed, s) for s, peak in peaks.items() if peak <= budget)
            assert plan.recompute_ms == pytest.approx(cheapest), seed
        least = smallest_peak_plan(timed, **model)
        at_least = [recompute_ms(timed, s) for s, peak in peaks.items() if peak == least.predicted_peak_bytes]
        assert least.recompute_ms == pytest.approx(min(at_least)), seed


def test_identical_blocks_pool_their_early_stopped_times_too():
    same = dict(retained_bytes=300, input_bytes=50)
    blocks = [BlockProfile(forward_ms=t, last_forward_ms=t / 2, **same) for t in (1.0, 3.0, 2.0)]
    assert [(b.forward_ms, b.last_forward_ms) for b in pooled_forward_times(blocks)] == [(2.0, 1.0)] * 3
    untimed = [*blocks, BlockProfile(forward_ms=4.0, **same)]  # one member without: none for the group
    assert {b.last_forward_ms for b in pooled_forward_times(untimed)} == {None}
