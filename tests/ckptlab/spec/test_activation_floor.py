"""``ckptlab.spec.limits.estimate_peak_floor`` is a true lower bound: for every built-in kind
and every ``hf`` architecture, under each strategy and precision, the bound from the shapes
stays at or under the peak the engine measures in-process on CPU (the exact live-tensor
tracker), and so does the least any plan keeps; the gradient check's bound stays under that
check's own peak."""

from __future__ import annotations

import pytest

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.limits import PeakFloor, estimate_activation_bytes, estimate_peak_floor
from tests.factories import HF_TINY, hf_model, spec_dict

MODELS = {
    "mlp": {"kind": "mlp", "depth": 8, "width": 64},
    "mlp_without_stem": {"kind": "mlp", "depth": 4, "width": 32, "stem": False},
    "resnet": {"kind": "resnet", "depth": 3, "channels": 4, "image_size": 16},
    "transformer": {"kind": "transformer", "depth": 3, "d_model": 16, "heads": 2, "seq_len": 16, "vocab_size": 300},
    "densenet": {"kind": "densenet", "depth": 4, "growth_rate": 4, "bn_size": 2, "image_size": 8},
    **{f"hf_{a}": hf_model(a) for a in sorted(HF_TINY)},
}
STRATEGIES = [
    {"strategy": "none"},
    {"strategy": "per_block"},
    {"strategy": "per_block", "every": 2},
    {"strategy": "sequential", "segments": 2},
    {"strategy": "selective"},
]


def _spec(model: dict, checkpoint: dict, **rest) -> ExperimentSpec:
    d = spec_dict(model=model, **{"batch_size": 32, "verify_gradients": False, **rest})
    return ExperimentSpec.model_validate({**d, "checkpoint": {**d["checkpoint"], **checkpoint}})


def _least(floor: PeakFloor) -> int:
    return floor.held + floor.batch_size * floor.least_per_sample


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_bound_is_at_most_the_measured_peak_under_every_strategy(name):
    from ckptlab.worker.engine.run import run_experiment

    for checkpoint in STRATEGIES:
        for amp in ("off", "bf16") if checkpoint["strategy"] == "per_block" else ("off",):
            spec = _spec(MODELS[name], checkpoint, amp=amp)
            floor = estimate_peak_floor(spec)
            peak = run_experiment(spec).peak_allocated_bytes
            assert floor is not None and not floor.gradient_check
            assert _least(floor) <= floor.total <= peak, (checkpoint, amp, floor, peak)
            # The activations are a real part of the bound, not a token one.
            assert floor.activations >= 0.1 * (peak - floor.held), (checkpoint, amp, floor, peak)


def test_a_planned_strategy_is_bounded_by_what_any_plan_keeps():
    from ckptlab.worker.engine.run import run_experiment

    spec = _spec(MODELS["transformer"], {"strategy": "auto", "budget_bytes": 3_500_000})
    floor = estimate_peak_floor(spec)
    assert floor.per_sample == floor.least_per_sample
    assert floor.total <= run_experiment(spec).peak_allocated_bytes


def test_a_compiled_loss_leaves_the_heads_term_out_and_stays_under_the_peak():
    """With the loss compiled into the model's graph (``compile_scope`` ``step``; ``auto``
    with ``search_compile`` may choose it) the partitioner may recompute the cross-entropy's
    log-probabilities that the head's term counts: that term is left out, and the bound is
    still at most the measured peak at both ends of the budget."""
    from ckptlab.worker.engine.run import run_experiment

    def compiled(scope: str, budget: float) -> ExperimentSpec:
        ck = {"strategy": "compile_budget", "compile_scope": scope, "activation_memory_budget": budget}
        return _spec(MODELS["transformer"], ck, timed_steps=0)

    assert estimate_peak_floor(compiled("step", 1.0)).total < estimate_peak_floor(compiled("blocks", 1.0)).total
    auto = _spec(MODELS["transformer"], {"strategy": "auto", "budget_bytes": 3_500_000, "search_compile": True})
    eager = _spec(MODELS["transformer"], {"strategy": "auto", "budget_bytes": 3_500_000})
    assert estimate_peak_floor(auto).total < estimate_peak_floor(eager).total
    for budget in (1.0, 0.0):
        spec = compiled("step", budget)
        assert estimate_peak_floor(spec).total <= run_experiment(spec).peak_allocated_bytes


@pytest.mark.parametrize("name", ["mlp", "transformer", "hf_llama", "hf_vit"])
def test_the_gradient_check_bound_is_at_most_the_checks_peak(name):
    torch = pytest.importorskip("torch")
    from ckptlab.worker.engine.gradcheck import verify_gradients
    from ckptlab.worker.measure.memory import LiveTensorTracker

    # sgd: the run's steps hold one copy of the parameters, the check two: the check binds.
    spec = _spec(MODELS[name], {"strategy": "per_block"}, optimizer="sgd").model_copy(update={"verify_gradients": True})
    floor = estimate_peak_floor(spec)
    assert floor.gradient_check
    with LiveTensorTracker() as tracker:
        verify_gradients(spec, torch.device("cpu"))
    assert floor.total <= tracker.peak_bytes, (floor, tracker.peak_bytes)


def test_every_term_grows_with_the_batch_and_the_kinds_without_shapes_have_none():
    small, large = (_spec(MODELS["hf_gpt2"], {"strategy": "none"}, batch_size=b) for b in (4, 8))
    assert estimate_activation_bytes(large) == 2 * estimate_activation_bytes(small)
    custom = ExperimentSpec.model_validate({"model": {"kind": "custom", "name": "x", "depth": 2}})
    assert estimate_activation_bytes(custom) is None and estimate_peak_floor(custom) is None


def test_checkpointing_lowers_the_bound_and_no_plan_goes_below_the_least():
    # 16 equal blocks: none keeps 16 inputs; every 4 keeps 4 at the loss and recomputes 4;
    # no plan keeps fewer than sqrt(16) = 4 at once.
    base = {"kind": "mlp", "depth": 16, "width": 64}
    none, every4 = (
        estimate_peak_floor(_spec(base, ck)) for ck in ({"strategy": "none"}, {"strategy": "per_block", "every": 4})
    )
    block = 64 * 4  # one block's input per sample, float32
    assert none.per_sample - every4.per_sample == 12 * block
    assert every4.least_per_sample == 64 * 4 + 8 + 4 * block  # the batch (inputs, labels) and 4 inputs
    assert none.least_per_sample == every4.least_per_sample < every4.per_sample
