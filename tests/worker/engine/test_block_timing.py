"""Block times measured like memory (worker/engine/block_timing.py, issue 31): repeated,
interleaved rounds without the tracker, identical blocks pooled, a plan's overhead as a
fraction of the un-checkpointed step with an interval; and ``auto``'s plan states it for
itself, its front and the uniform plans of the same model, in the form the plan page reads;
and the prediction agrees with the paired measurement on a busy host (issue 31's tolerance)."""

from __future__ import annotations

import statistics

import pytest
import torch

from ckptlab.backend.services.plans import predicted_front
from ckptlab.planning.planner import BlockProfile, Segment, pooled_forward_times, recompute_ms, sequential_segments
from ckptlab.worker.engine.block_timing import CPU_CLOCK, ChainTimes, time_chain
from ckptlab.worker.engine.plan_overheads import predict_overheads, uniform_settings
from ckptlab.worker.engine.run import run_experiment
from ckptlab.worker.engine.training import build_checkpointed, make_optimizer
from tests.factories import PLANNER_MODELS, make_spec


def times(**overrides) -> ChainTimes:
    """Three rounds of four blocks: 0, 1 and 3 identical, 2 alone; steps of 100 ms."""
    base = {
        "step_ms": (100.0, 100.0, 100.0),
        "block_ms": ((10.0, 12.0, 11.0), (9.0, 11.0, 13.0), (30.0, 30.0, 30.0), (11.0, 10.0, 12.0)),
        "last_block_ms": ((8.0, 8.0, 8.0), (8.0, 8.0, 8.0), (20.0, 20.0, 20.0), (8.0, 8.0, 8.0)),
        "groups": (0, 0, 2, 0),
        "clock": CPU_CLOCK,
    }
    return ChainTimes(**{**base, **overrides})


def test_identical_blocks_share_one_estimate_and_a_segment_ends_with_its_early_stopped_block():
    t = times()
    assert t.forward_ms() == [11.0, 11.0, 30.0, 11.0]  # the median of the group's nine samples
    assert t.last_ms() == [8.0, 8.0, 20.0, 8.0]
    segments = (Segment(0, 2, True), Segment(2, 4, False))
    o = t.overhead(segments)
    assert o.recompute_ms == pytest.approx(11.0 + 8.0)
    assert o.estimate == pytest.approx(0.19) and o.low <= o.estimate <= o.high
    assert o.rounds == 3 and o.clock == CPU_CLOCK
    per_block = t.overhead(tuple(Segment(i, i + 1, True) for i in range(4)))
    assert per_block.estimate == pytest.approx((8 + 8 + 20 + 8) / 100)
    assert t.overhead((Segment(0, 4, False),)).as_dict()["estimate"] == 0.0
    # each micro-batch recomputes
    assert times(micro_batches=2).overhead(segments).estimate == pytest.approx(0.38)


def test_a_plans_overhead_is_the_median_of_its_per_round_fractions_with_an_interval():
    t = times(step_ms=(100.0, 50.0, 200.0))  # a load burst in round 2: both sides alike in reality
    o = t.overhead((Segment(2, 3, True),))
    assert o.estimate == pytest.approx(0.2)  # rounds: 0.2, 0.4, 0.1
    assert o.q1 <= o.estimate <= o.q3
    d = o.as_dict()
    assert {"estimate", "low", "high", "rounds", "clock"} <= d.keys()


def test_time_chain_runs_rounds_outside_the_tracker_and_leaves_threads_and_rng_as_they_were():
    spec = make_spec(**PLANNER_MODELS["mlp"])
    dev = torch.device("cpu")
    built = build_checkpointed(spec, dev)
    torch.manual_seed(123)
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    t = time_chain(spec, dev, built, make_optimizer(spec, list(built.module.parameters())), rounds=4)
    assert torch.equal(torch.get_rng_state(), rng) and torch.get_num_threads() == threads
    assert t.rounds == 4 and t.threads == 1 and t.clock == CPU_CLOCK
    assert len(t.block_ms) == len(built.blocks) and all(len(b) == 4 for b in t.block_ms)
    assert all(ms > 0 for ms in t.step_ms) and all(ms > 0 for ms in t.forward_ms())
    n = len(built.blocks)
    assert t.groups[1:] == (t.groups[1],) * (n - 1)  # the MLP's hidden blocks are one computation
    public = t.public()
    assert public["rounds"] == 4 and len(public["blocks"]) == n and public["step_ms"]["median"] > 0


def test_blocks_that_differ_in_their_inputs_are_timed_apart():
    spec = make_spec(**PLANNER_MODELS["densenet"])  # each layer takes all earlier features
    built = build_checkpointed(spec, torch.device("cpu"))
    t = time_chain(spec, torch.device("cpu"), built, make_optimizer(spec, list(built.module.parameters())), rounds=3)
    assert t.groups == tuple(range(len(built.blocks)))


def test_predict_overheads_orders_plans_by_what_they_recompute():
    spec = make_spec(**PLANNER_MODELS["transformer"])
    n = spec.model.depth
    got = predict_overheads(
        spec,
        {
            "none": (Segment(0, n, False),),
            "half": ((Segment(0, n // 2, True), Segment(n // 2, n, False))),
            "per_block": tuple(Segment(i, i + 1, True) for i in range(n)),
        },
        rounds=4,
    )
    assert got["none"].estimate == 0.0
    assert 0 < got["half"].estimate < got["per_block"].estimate < 1.5


def test_auto_states_its_predicted_overhead_front_and_alternatives_as_the_plan_page_reads_them():
    kind = PLANNER_MODELS["transformer"]
    none = run_experiment(make_spec(**kind)).dump()["peak_allocated_bytes"]
    auto = {"checkpoint.strategy": "auto", "checkpoint.budget_bytes": none * 9 // 10}
    s = run_experiment(make_spec(**kind, **auto)).dump()
    plan = s["plan"]
    assert plan["timing"]["rounds"] >= 3 and plan["timing"]["clock"] == CPU_CLOCK
    o = plan["predicted_overhead"]
    assert plan["checkpointed_blocks"] and 0 < o["estimate"] and o["low"] <= o["estimate"] <= o["high"]
    # the planner chose on the measured times: its recomputation is the blocks' as recorded
    blocks = pooled_forward_times([BlockProfile(**b) for b in plan["blocks"]])
    segments = [Segment(*seg) for seg in plan["segments"]]
    assert plan["recompute_ms"] == pytest.approx(recompute_ms(blocks, segments))
    assert all(b["last_forward_ms"] is not None for b in plan["blocks"])
    front = predicted_front(plan)
    assert len(front) == len(plan["front"]) >= 2
    assert front[0].overhead_pct > 0 and front[-1].overhead_pct == 0.0
    assert all(p.overhead_low_pct is not None and p.budget_bytes >= p.peak_bytes for p in front)
    n = kind["model"]["depth"]
    names = {a["name"]: a for a in plan["alternatives"]}
    assert {"per_block (every 1)", *(f"sequential ({k})" for k in range(2, n + 1))} <= names.keys()
    per_block = names["per_block (every 1)"]
    assert per_block["strategy"] == "per_block" and per_block["every"] == 1
    assert per_block["predicted_overhead"]["estimate"] >= o["estimate"]
    assert per_block["checkpointed_blocks"] == list(range(n))
    assert names["sequential (2)"]["segments"] == 2  # the setting's own field, as set
    assert names["sequential (2)"]["plan_segments"] == [[0, n // 2, True], [n // 2, n, False]]


def test_the_uniform_settings_come_from_the_strategy_table():
    settings = {s["name"]: (s, segs) for s, segs in uniform_settings(4, make_spec().checkpoint)}
    assert set(settings) == {"per_block (every 1)", "sequential (2)", "sequential (3)", "sequential (4)"}
    assert settings["sequential (3)"][1] == (Segment(0, 1, True), Segment(1, 2, True), Segment(2, 4, False))
    assert settings["per_block (every 1)"][1] == tuple(Segment(i, i + 1, True) for i in range(4))


#: Two models whose un-checkpointed step takes 40-60 ms on one thread (the test's time):
#: Hugging Face Llama and ViT, 4 layers of width 128 (bench_overhead_prediction's, smaller).
_HF = {"kind": "hf", "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 512}
ACCURACY = {
    "hf-llama": {"model": {**_HF, "architecture": "llama", "seq_len": 128, "vocab_size": 500}, "batch_size": 4},
    "hf-vit": {"model": {**_HF, "architecture": "vit", "patch_size": 8, "image_size": 64}, "batch_size": 16},
}


@pytest.fixture
def one_thread():
    """The whole run on one torch thread (the timing pass and the planner's timing use one
    either way: ``timing_cpu_threads``), for the test's speed beside the spinners."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("name", sorted(ACCURACY))
def test_the_predicted_overhead_is_close_to_the_paired_one_on_a_busy_host(name, cpu_load, one_thread):
    """Issue 31: with one spinning process per core, each plan's predicted overhead (the
    blocks and the step timed apart, :func:`predict_overheads`, 12 rounds) agrees with its
    measured paired overhead (CPU time, 3 runs of 12 rounds) within issue 31's ±15% relative
    or ±3 percentage points, up to what the two measurements resolve: the prediction's 95%
    interval meets the span of the 3 runs' estimates widened by that tolerance.

    Why not the point estimates alone: beside the spinners one configuration's paired
    overhead moves 5-10 points from run to run (hf-llama sequential 2, 30 rounds each:
    +23.9%, +18.6%, +14.9%; hf-vit: +18.0% and +27.6% at 12), more than the tolerance, so a
    point-against-point check failed on noise in CI (docs/benchmarks.md, "Predicted against
    measured overhead", ninth session). It still fails a prediction off by more than the
    noise (scaled by 1.4 it failed on Llama, by 1.6 on ViT): the profile step's times under
    the tracker put it 2-21x too high, and until CPU runs kept freed memory
    (:mod:`ckptlab.worker.measure.heap`) a lower peak looked up to a third of DenseNet's step
    cheaper."""
    spec = make_spec(**ACCURACY[name], timed_steps=12, steps=2, verify_gradients=False)
    n = len(build_checkpointed(spec, torch.device("cpu")).blocks)
    plans = {"per_block": tuple(Segment(i, i + 1, True) for i in range(n)), "sequential 2": sequential_segments(n, 2)}
    predicted = predict_overheads(spec, plans, rounds=12)
    checkpoints = {
        "per_block": {"checkpoint.strategy": "per_block"},
        "sequential 2": {"checkpoint.strategy": "sequential", "checkpoint.segments": 2},
    }
    measured: dict[str, list[float]] = {plan: [] for plan in plans}
    for _ in range(3):
        for plan, checkpoint in checkpoints.items():
            run = make_spec(**ACCURACY[name], timed_steps=12, steps=2, verify_gradients=False, **checkpoint)
            paired = run_experiment(run).dump()["paired_overhead"]
            assert paired["clock"] == CPU_CLOCK
            measured[plan].append(paired["estimate_pct"])
    for plan in plans:
        runs, p = measured[plan], predicted[plan]
        tolerance = max(0.15 * abs(statistics.median(runs)), 3.0)
        low, high = 100 * p.low, 100 * p.high
        assert low <= 100 * p.estimate <= high
        assert low <= max(runs) + tolerance and high >= min(runs) - tolerance, (plan, 100 * p.estimate, low, high, runs)


@pytest.mark.gpu
def test_on_cuda_the_blocks_are_timed_without_stalling_the_queue():
    """On CUDA (wall time) a block's forward and recomputation are timed between CUDA
    events, with no synchronize inside the checkpointed run: on the transformer 8x512 (seq
    512, batch 16, fp32) per_block's predicted overhead is under 1.4x its paired measured one
    (an H200: +25.8% against +20.5%; with a synchronize around each timed part +41%
    against +21%). Not issue 31's ±15%: on CUDA the prediction stays high (docs/benchmarks.md).
    ``auto`` stays under a budget midway between none's and per_block's peaks plus 64 MiB
    (scripts/gpu-check's margin: the CUDA prediction is not exact to the byte)."""
    model = {"kind": "transformer", "depth": 8, "d_model": 512, "heads": 8, "seq_len": 512, "vocab_size": 8000}
    common = {"model": model, "batch_size": 16, "device": "cuda", "timed_steps": 20, "verify_gradients": False}
    none = run_experiment(make_spec(**common)).dump()
    per_block = run_experiment(make_spec(**common, **{"checkpoint.strategy": "per_block"})).dump()
    budget = (none["peak_allocated_bytes"] + per_block["peak_allocated_bytes"]) // 2 + 64 * 2**20
    auto = run_experiment(make_spec(**common, **{"checkpoint.strategy": "auto", "checkpoint.budget_bytes": budget}))
    plan = auto.dump()["plan"]
    assert plan["timing"]["clock"] == "wall time" and auto.dump()["peak_allocated_bytes"] <= budget
    predicted = next(a for a in plan["alternatives"] if a["strategy"] == "per_block")["predicted_overhead"]
    measured = per_block["paired_overhead"]["estimate_pct"]
    assert 0 < 100 * predicted["estimate"] < 1.4 * measured, (predicted, measured)
