"""The strategy table: registration, labels, order, and the groups each built-in wraps."""

from __future__ import annotations

import pytest

from ckptlab.spec.experiment import CheckpointSpec
from ckptlab.strategies import (
    BASELINE,
    STRATEGIES,
    Mechanism,
    Strategy,
    get_strategy,
    register_strategy,
    registered,
    strategy_names,
)


def test_names_are_in_rank_order_and_the_baseline_keeps_everything():
    names = strategy_names()
    assert names[0] == BASELINE and set(names) == set(STRATEGIES)
    ranks = [STRATEGIES[n].rank for n in names]
    assert ranks == sorted(ranks)
    base = get_strategy(BASELINE)
    assert base.mechanism == Mechanism.KEEP and not base.recomputes and base.groups(8, CheckpointSpec()) == []


def test_recomputes_and_reentrant_need_follow_from_the_mechanism():
    by_mechanism = {s.mechanism: s for s in STRATEGIES.values()}
    assert by_mechanism[Mechanism.CHECKPOINT].recomputes
    assert not by_mechanism[Mechanism.CHECKPOINT].needs_non_reentrant
    assert by_mechanism[Mechanism.CHECKPOINT_WITH_POLICY].needs_non_reentrant
    assert not by_mechanism[Mechanism.SAVE_ON_CPU].recomputes


@pytest.mark.parametrize(("n", "segments"), [(8, 1), (8, 2), (8, 3), (9, 4), (72, 36)])
def test_sequential_groups_are_checkpoint_sequentials_segments(n, segments):
    # torch.utils.checkpoint.checkpoint_sequential: n // segments blocks per segment, the
    # first segments - 1 checkpointed, the rest (the last segment) not.
    groups = get_strategy("sequential").groups(n, CheckpointSpec(strategy="sequential", segments=segments))
    size = n // segments
    assert groups == [(i * size, (i + 1) * size) for i in range(segments - 1)]


def test_every_groups_cover_all_blocks_the_last_one_shorter():
    ck = CheckpointSpec(strategy="per_block", every=3)
    assert get_strategy("per_block").groups(8, ck) == [(0, 3), (3, 6), (6, 8)]


def test_labels_fill_the_template_and_mark_missing_fields():
    assert get_strategy("sequential").label_for({"segments": 4}) == "sequential (4)"
    assert get_strategy("selective").label_for({"every": 2}) == "selective (?, every 2)"
    assert get_strategy("auto").label_for({"budget_bytes": 25165824}) == "auto (25,165,824 B)"


def test_simplicity_orders_by_rank_then_the_strategys_own_fields():
    seq, block = get_strategy("sequential"), get_strategy("per_block")
    keys = [seq.simplicity({"segments": 4}), block.simplicity({"every": 1}), seq.simplicity({"segments": 2})]
    assert sorted(keys) == [keys[2], keys[0], keys[1]]
    assert block.simplicity({"every": 4}) < block.simplicity({"every": 1})  # larger groups: simpler


def test_a_taken_or_malformed_name_is_refused_and_a_registration_can_be_undone(noop_strategy):
    with pytest.raises(ValueError, match="already registered"):
        register_strategy(noop_strategy)
    odd = Strategy("Bad Name", "", "", (), Mechanism.KEEP, lambda n, ck: [], 99)
    with pytest.raises(ValueError, match="lower-case"):
        register_strategy(odd)
    other = Strategy("temporary", "", "temporary", (), Mechanism.KEEP, lambda n, ck: [], 99)
    with registered(other):
        assert "temporary" in STRATEGIES
    assert "temporary" not in STRATEGIES


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown strategy 'bogus'; expected one of none, sequential"):
        get_strategy("bogus")
