"""Strategy ``auto`` with selective blocks (issue 31): per block keep, recompute all, or
recompute all but the matmul (and attention) outputs. A plan with selective blocks runs at
or under its predicted peak (the byte guarantee), the engine applies each block's policy,
and the plan, its front, its alternatives and its timing name the policies."""

from __future__ import annotations

import pytest
from torch import nn

from ckptlab.planning.planner import ChainPlan, Segment, predict_peak, recompute_ms
from ckptlab.worker.engine import autoplan
from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.engine.strategies import CheckpointedGroup, GroupedAway, apply_strategy
from tests.factories import PLANNER_MODELS, make_spec

TRANSFORMER = PLANNER_MODELS["transformer"]  # built-in, 4 layers, d 64, seq 64, batch 4
MA, M = "save_matmuls_and_attention", "save_matmuls"


def auto(budget: int, **extra) -> dict:
    spec = make_spec(**TRANSFORMER, **{"checkpoint.strategy": "auto", "checkpoint.budget_bytes": budget}, **extra)
    return run_experiment(spec).dump()


@pytest.mark.parametrize(
    "segments",
    [
        (Segment(0, 1, True, MA), Segment(1, 2, True), Segment(2, 3, False), Segment(3, 4, True, M)),
        (Segment(0, 1, True, M), Segment(1, 2, True, M), Segment(2, 3, True, MA), Segment(3, 4, True, MA)),
        (Segment(0, 1, False), Segment(1, 2, True, MA), Segment(2, 4, True)),
    ],
    ids=["mixed", "all-selective", "keep-selective-segment"],
)
def test_a_plan_with_selective_blocks_runs_at_or_under_its_predicted_peak(monkeypatch, segments):
    # The planner's choice replaced by a given plan, predicted under the same memory model.
    def given(blocks, *, budget_bytes, **model):
        assert all(s.policy in blocks[s.start].policies for s in segments if s.policy), "policy not measured"
        ckpt = tuple(i for s in segments if s.checkpointed for i in range(s.start, s.end))
        return ChainPlan(segments, ckpt, recompute_ms(blocks, segments), predict_peak(blocks, segments, **model))

    monkeypatch.setattr(autoplan, "plan_chain", given)
    none = run_experiment(make_spec(**TRANSFORMER, verify_gradients=False)).dump()["peak_allocated_bytes"]
    s = auto(none - 1)
    measured, predicted = s["peak_allocated_bytes"], s["predicted_peak_bytes"]
    assert measured <= predicted <= measured * 1.02, (measured, predicted)
    assert s["gradients_match"] is True
    plan = s["plan"]
    assert plan["selective_blocks"] == {str(x.start): x.policy for x in segments if x.policy}
    assert [seg[3] if len(seg) > 3 else None for seg in plan["segments"]] == [x.policy for x in segments]
    assert plan["predicted_overhead"]["estimate"] > 0
    # the timeline's intended-against-kept reads each region's own policy: a selective
    # region's saved matmul outputs are what it meant to keep, not an excess
    assert s["region_keeps"] and all(k["excess_bytes"] == 0 for k in s["region_keeps"]), s["region_keeps"]
    assert any(k["policy_bytes"] > 0 for k in s["region_keeps"])
    assert "region_keeps_more_than_its_inputs" not in {f["code"] for f in s["findings"]}


def test_auto_offers_selective_blocks_and_keeps_its_budget_where_they_are_the_alternative():
    none = run_experiment(make_spec(**TRANSFORMER, verify_gradients=False)).dump()["peak_allocated_bytes"]
    plan = auto(none - 1, verify_gradients=False)["plan"]
    assert all({MA, M} <= {x["policy"] for x in b["policy_profiles"]} for b in plan["blocks"])
    assert plan["selective_policies"] == sorted([MA, M])
    assert all(set(b["selective_ms"]) == {MA, M} for b in plan["timing"]["blocks"])
    alternatives = {a["name"]: a for a in plan["alternatives"]}
    sequential = [a for a in plan["alternatives"] if a["strategy"] == "sequential"]
    # a setting's own fields stay as set (sequential's count), the plan's split beside them
    assert sequential and all(type(a["segments"]) is int and a["plan_segments"] for a in sequential)
    for policy in (MA, M):
        alt = alternatives[f"selective ({policy}, every 1)"]
        assert alt["strategy"] == "selective" and alt["policy"] == policy
        assert alt["selective_blocks"] == dict.fromkeys(("0", "1", "2", "3"), policy)
        assert alt["predicted_overhead"] is not None and alt["predicted_overhead"]["estimate"] > 0
    # A budget just above every block under save_matmuls_and_attention (above by two of the
    # planner's byte units): auto recomputes no more than that plan, and keeps the budget.
    alt = alternatives[f"selective ({MA}, every 1)"]
    budget = alt["predicted_peak_bytes"] + (alt["predicted_peak_bytes"] - plan["fixed_bytes"]) // 512
    s = auto(budget)
    assert s["peak_allocated_bytes"] <= s["predicted_peak_bytes"] <= budget
    assert s["gradients_match"] is True
    chosen = s["plan"]
    same_run = {a["name"]: a for a in chosen["alternatives"]}[alt["name"]]
    assert same_run["predicted_peak_bytes"] <= budget  # bytes are the same in every profile
    assert chosen["recompute_ms"] <= same_run["recompute_ms"] + 1e-6


def test_a_selective_range_is_a_checkpointed_group_under_its_policy():
    blocks = nn.Sequential(*(nn.Linear(4, 4) for _ in range(3)))
    ck = make_spec(**{"checkpoint.strategy": "auto", "checkpoint.budget_bytes": 10**9}).checkpoint
    import torch

    assert apply_strategy(blocks, ck, device=torch.device("cpu"), ranges=[(0, 1, MA), (1, 3)]) == 2
    assert isinstance(blocks[0], CheckpointedGroup) and blocks[0].context_fn is not None
    assert blocks[0].policy == MA and blocks[0].context_fn.args[0] is not None
    assert isinstance(blocks[1], CheckpointedGroup) and blocks[1].context_fn is None and blocks[1].policy is None
    assert isinstance(blocks[2], GroupedAway)
    reentrant = ck.model_copy(update={"use_reentrant": True})
    with pytest.raises(ValueError, match="use_reentrant=False"):
        apply_strategy(nn.Sequential(nn.Linear(4, 4)), reentrant, device=torch.device("cpu"), ranges=[(0, 1, M)])


#: issue 31's transformer (bench/bench_auto_front.py): on an H200 two of auto's plans whose
#: last checkpointed segment held two blocks peaked 2,100,012 B above their prediction and
#: budget while the block profile read no temporaries on CUDA.
FRONT_TRANSFORMER = {
    "model": {"kind": "transformer", "depth": 4, "d_model": 128, "heads": 4, "seq_len": 256, "vocab_size": 1000},
    "batch_size": 4,
}


@pytest.mark.gpu
@pytest.mark.parametrize(
    "segments",
    [
        pytest.param(
            (Segment(0, 2, True), Segment(2, 4, True)),
            marks=pytest.mark.xfail(
                strict=False,  # (the excess is the card's: another may pass, and report XPASS)
                reason="H200, 2026-11-27: the allocator's peak sits 264,704 B above the live tensors' peak "
                "(108,397,568 against 108,132,864 B, in segment [0, 2)'s backward) and above the prediction "
                "(108,133,588 B): bytes the allocator holds that no tensor owns, not yet in the block profile",
            ),
        ),
        (Segment(0, 1, False), Segment(1, 2, True), Segment(2, 4, True)),
        (Segment(0, 1, True), Segment(1, 2, True), Segment(2, 3, True), Segment(3, 4, True)),
    ],
    ids=["two-segments", "keep-then-two", "per-block"],
)
def test_a_plan_on_cuda_runs_at_or_under_its_predicted_peak(monkeypatch, segments):
    def given(blocks, *, budget_bytes, **model):
        ckpt = tuple(i for s in segments if s.checkpointed for i in range(s.start, s.end))
        return ChainPlan(segments, ckpt, recompute_ms(blocks, segments), predict_peak(blocks, segments, **model))

    monkeypatch.setattr(autoplan, "plan_chain", given)
    cuda = {"device": "cuda", "optimizer": "adam", "timed_steps": 0, "verify_gradients": False}
    none = run_experiment(make_spec(**FRONT_TRANSFORMER, **cuda)).dump()["peak_allocated_bytes"]
    s = run_experiment(
        make_spec(**FRONT_TRANSFORMER, **cuda, **{"checkpoint.strategy": "auto", "checkpoint.budget_bytes": none - 1})
    ).dump()
    measured, predicted = s["peak_allocated_bytes"], s["predicted_peak_bytes"]
    # the allocator rounds each block up to 512 B: the prediction may sit that much above
    assert measured <= predicted <= measured * 1.02, (measured, predicted, s["plan"]["blocks"])
    assert [tuple(seg[:3]) for seg in s["plan"]["segments"]] == [(x.start, x.end, x.checkpointed) for x in segments]
    # the block profile reads a block's temporaries on CUDA too (the allocator's peak per window)
    assert all(b["forward_bytes"] > 0 and b["backward_bytes"] > 0 for b in s["plan"]["blocks"]), s["plan"]["blocks"]
