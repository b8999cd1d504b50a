"""The engine: every model x strategy runs; the checkpointing behaviours practitioners rely
on (segment law, RNG preservation, the reentrant pitfall, accumulation, OOM) hold."""

import math

import pytest
import torch

from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.strategies import STRATEGIES
from ckptlab.worker.engine.run import resolve_device, run_experiment
from ckptlab.worker.errors import RunError, RunOutOfMemory
from tests.factories import make_spec, spec_dict
from tests.segment_law import retained_bytes

SMALL_MODELS = {
    "mlp": {"kind": "mlp", "depth": 4, "width": 32},
    "resnet": {"kind": "resnet", "depth": 4, "channels": 4, "image_size": 16},
    "transformer": {"kind": "transformer", "depth": 4, "d_model": 32, "heads": 2, "seq_len": 16, "vocab_size": 50},
    "densenet": {"kind": "densenet", "depth": 4, "growth_rate": 4, "image_size": 8},
}


def run(**overrides):
    steps = []
    summary = run_experiment(make_spec(**overrides), on_step=steps.append).dump()
    return summary, steps


def test_records_every_step_with_consistent_timings_and_categories():
    summary, steps = run(steps=4)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    for s in steps:
        assert s["step_ms"] == pytest.approx(s["forward_ms"] + s["backward_ms"] + s["optimizer_ms"], rel=1e-6)
        assert 0 < s["allocated_bytes"] <= s["peak_allocated_bytes"]
        assert s["reserved_bytes"] is None  # CPU
        assert s["peak_allocated_bytes"] == max(
            s["extra"][k] for k in ("forward_peak_bytes", "backward_peak_bytes", "optimizer_peak_bytes")
        )
    assert summary["device"] == "cpu" and summary["params_without_grad"] == 0
    assert math.isfinite(summary["final_loss"])
    # categories are exact on CPU: they add up to the bytes they break down
    fwd = steps[-1]["extra"]["memory_at_forward_end"]
    assert sum(fwd.values()) == steps[-1]["allocated_bytes"]
    assert fwd["activations"] == summary["activation_bytes"]
    param_bytes = summary["param_count"] * 4
    assert fwd["parameters"] == param_bytes
    # Adam: exp_avg + exp_avg_sq, plus a 4-byte step counter per parameter tensor
    assert 2 * param_bytes < fwd["optimizer_state"] <= 2 * param_bytes + 4 * 64
    peak = summary["memory_at_peak"]
    assert sum(peak.values()) == summary["peak_allocated_bytes"]
    assert peak["gradients"] == param_bytes
    assert summary["environment"]["torch_version"] == torch.__version__


MATRIX = [
    (kind, strategy, reentrant, amp)
    for kind in sorted(SMALL_MODELS)
    for strategy in STRATEGIES
    for reentrant in (False, True)
    for amp in ("off", "bf16")
    if not (strategy == "selective" and reentrant)  # refused by the spec (test_spec)
    and not STRATEGIES[strategy].compiles  # compiles for seconds per run: tests/worker/engine/test_compile_budget.py
]


@pytest.mark.parametrize(("kind", "strategy", "reentrant", "amp"), MATRIX)
def test_every_model_and_strategy_runs(kind, strategy, reentrant, amp):
    summary, steps = run(
        model=SMALL_MODELS[kind],
        batch_size=2,
        steps=2,
        amp=amp,
        **{"checkpoint.strategy": strategy, "checkpoint.segments": 2, "checkpoint.use_reentrant": reentrant},
        **({"checkpoint.budget_bytes": 10**12} if STRATEGIES[strategy].planned else {}),
    )
    assert len(steps) == 2 and summary["activation_bytes"] > 0
    assert summary["params_without_grad"] == 0
    if strategy == "none":
        assert summary["gradients_match"] is None
    else:
        assert summary["gradients_match"] is True, summary["grad_max_abs_diff"]
    if strategy in ("sequential", "per_block", "selective"):
        assert summary["recompute_peak_bytes"] > 0
    else:
        assert summary["recompute_peak_bytes"] == 0


#: Bytes of the CPU RNG state each checkpoint keeps with preserve_rng_state (5,056 on torch 2.13).
RNG_STATE = torch.get_rng_state().nbytes


def tensor_bytes(summary: dict) -> int:
    """The activation bytes less the RNG states the checkpoints keep (issue 19): the tensors
    the blocks keep, which the segment law is about."""
    return summary["activation_bytes"] - summary["rng_state_bytes"]


@pytest.mark.parametrize("kind", sorted(SMALL_MODELS))
def test_per_block_checkpointing_saves_where_blocks_retain_more_than_their_input(kind):
    base = {"model": SMALL_MODELS[kind], "batch_size": 2, "steps": 2, "verify_gradients": False}
    none, _ = run(**base)
    per_block, _ = run(**base, **{"checkpoint.strategy": "per_block"})
    # One RNG state per checkpointed block (preserve_rng_state), counted in the activations.
    assert per_block["rng_state_bytes"] == SMALL_MODELS[kind]["depth"] * RNG_STATE and none["rng_state_bytes"] == 0
    if kind == "mlp":
        # Linear -> ReLU keeps one tensor per block (its output, the next block's input):
        # checkpointing each block keeps that same input, so a = b and no tensor is saved.
        assert tensor_bytes(per_block) == tensor_bytes(none)
    else:
        assert tensor_bytes(per_block) < 0.8 * tensor_bytes(none)


@pytest.mark.parametrize(("n", "segments"), [(12, 1), (12, 2), (12, 3), (12, 4), (12, 5), (12, 6), (12, 12)])
def test_activation_bytes_follow_the_segment_law(n, segments):
    """Uniform MLP blocks: each retains a = B*w*4 bytes; a segment input is b = a. The
    measured difference to no checkpointing equals the law's difference within 5%."""
    base = {"model.depth": n, "model.width": 64, "batch_size": 16, "verify_gradients": False}
    none, _ = run(**base)
    seq, _ = run(**base, **{"checkpoint.strategy": "sequential", "checkpoint.segments": segments})
    a = b = 16 * 64 * 4
    predicted = none["activation_bytes"] - n * a + retained_bytes(n, segments, a, b)
    assert tensor_bytes(seq) == pytest.approx(predicted, rel=0.05)
    assert seq["rng_state_bytes"] == (segments - 1) * RNG_STATE  # checkpoint_sequential: all but the last


def test_segments_one_saves_nothing_and_segments_four_saves():
    none, _ = run()
    one, _ = run(**{"checkpoint.strategy": "sequential", "checkpoint.segments": 1})
    four, _ = run(**{"checkpoint.strategy": "sequential", "checkpoint.segments": 4})
    assert one["activation_bytes"] == pytest.approx(none["activation_bytes"], rel=0.02)
    assert tensor_bytes(four) < 0.75 * tensor_bytes(none)


@pytest.mark.parametrize("reentrant", [False, True])
def test_dropout_masks_differ_without_rng_preservation(reentrant):
    base = {"model.dropout": 0.3, "checkpoint.strategy": "sequential", "checkpoint.segments": 4}
    base["checkpoint.use_reentrant"] = reentrant
    kept, _ = run(**base, **{"checkpoint.preserve_rng_state": True})
    lost, _ = run(**base, **{"checkpoint.preserve_rng_state": False})
    assert kept["gradients_match"] is True and kept["grad_max_abs_diff"] <= 1e-6
    assert lost["gradients_match"] is False and lost["grad_max_abs_diff"] > 1e-4


def test_reentrant_checkpoint_without_grad_inputs_loses_gradients():
    """The seeds' pitfall: reentrant checkpoint whose input does not require grad."""
    base = {"model.stem": False, "checkpoint.strategy": "sequential", "checkpoint.segments": 4}
    bad, _ = run(**base, **{"checkpoint.use_reentrant": True})
    good, _ = run(**base, **{"checkpoint.use_reentrant": False})
    assert bad["params_without_grad"] == 12  # 3 checkpointed segments x 2 blocks x (weight, bias)
    assert bad["gradients_match"] is False
    assert any("None of the inputs have requires_grad=True" in w for w in bad["warnings"])
    assert good["params_without_grad"] == 0 and good["gradients_match"] is True


def test_gradient_accumulation_keeps_micro_batch_memory():
    one, s1 = run(batch_size=16, grad_accum_steps=1, verify_gradients=False)
    four, s4 = run(batch_size=16, grad_accum_steps=4, verify_gradients=False)
    big, _ = run(batch_size=64, grad_accum_steps=1, verify_gradients=False)
    assert four["activation_bytes"] == one["activation_bytes"] < big["activation_bytes"]
    # the recorded loss is the sum of the micro-batch losses divided by the accumulation steps
    assert 0.5 * s1[0]["loss"] < s4[0]["loss"] < 2 * s1[0]["loss"]


def test_memory_limit_emulates_out_of_memory():
    with pytest.raises(RunOutOfMemory) as ei:
        run(memory_limit_bytes=200_000)
    d = ei.value.details
    assert d["limit_bytes"] == 200_000 and d["live_bytes"] > 200_000
    assert d["phase"] in ("setup", "forward", "backward", "optimizer") and d["step"] >= 0
    assert ei.value.status == "oom"
    # a limit above the peak fits
    ok, _ = run(memory_limit_bytes=10 * 2**20)
    assert ok["peak_allocated_bytes"] <= 10 * 2**20


def test_out_of_memory_advice_follows_the_phase_it_happened_in():
    # In setup (the model and its copies) checkpointing cannot help; in forward it can.
    with pytest.raises(RunOutOfMemory) as setup:
        run(memory_limit_bytes=1_000)
    assert setup.value.details["phase"] == "setup"
    assert "checkpointing cannot help" in str(setup.value) and "checkpoint more" not in str(setup.value)
    fixed, _ = run(memory_limit_bytes=10 * 2**20)
    above_fixed = fixed["memory_at_forward_end"]["parameters"] + fixed["memory_at_forward_end"]["optimizer_state"]
    with pytest.raises(RunOutOfMemory) as later:
        run(memory_limit_bytes=above_fixed + 4096, batch_size=256, verify_gradients=False)
    assert later.value.details["phase"] in ("forward", "backward")
    assert "checkpoint more blocks" in str(later.value)


def test_fp16_uses_grad_scaler_and_matches():
    summary, _ = run(amp="fp16", **{"checkpoint.strategy": "per_block"})
    assert summary["gradients_match"] is True and math.isfinite(summary["final_loss"])


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_optimizer_state_size(optimizer):
    summary, _ = run(optimizer=optimizer)
    state = summary["memory_at_forward_end"]["optimizer_state"]
    param_bytes = summary["param_count"] * 4
    if optimizer == "sgd":
        assert state == 0
    else:
        assert 2 * param_bytes <= state < 2 * param_bytes + 4096


def test_checkpoint_errors_are_failures_with_warnings_kept():
    with pytest.raises(RunError) as ei:
        run(device="cuda") if not torch.cuda.is_available() else pytest.skip("CUDA present")
    assert "CUDA is not available" in str(ei.value)


def test_cuda_request_without_cuda_is_refused():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(RunError, match="CUDA is not available"):
        resolve_device("cuda:1")


@pytest.mark.gpu
def test_cuda_run_reports_reserved_and_nvml_bytes(tmp_path):
    snap = tmp_path / "snap.pickle"
    summary = run_experiment(
        make_spec(device="cuda", memory_snapshot=True, **{"checkpoint.strategy": "per_block"}),
        snapshot_path=str(snap),
    ).dump()
    assert summary["reserved_bytes"] >= summary["peak_allocated_bytes"] > 0
    assert summary["environment"]["capability"]
    assert snap.exists() and snap.stat().st_size > 0


def test_summary_of_a_diverged_run_is_json_safe():
    import json

    from ckptlab.worker.engine.summarize import finite_or_none

    summary = finite_or_none({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf")}, "e": 2})
    assert summary == {"a": None, "b": [1.0, None], "c": {"d": None}, "e": 2}
    json.dumps(summary, allow_nan=False)


@pytest.mark.parametrize("checkpoint", [{"strategy": "sequential", "segments": 1}, {"strategy": "offload"}])
@pytest.mark.parametrize(
    "model",
    [
        {"kind": "transformer", "depth": 2, "d_model": 32, "heads": 2, "seq_len": 64, "vocab_size": 500},
        {"kind": "mlp", "depth": 4, "width": 64},
    ],
)
def test_settings_that_keep_what_none_keeps_never_read_as_keeping_more(model, checkpoint):
    # One counting rule: the reference forward and the engine both count the output (the
    # transformer's logits are 6% of its activations, over the 1% margin of the finding).
    body = spec_dict(steps=2, batch_size=4, model=model)
    body["checkpoint"] = {**body["checkpoint"], **checkpoint}
    summary = run_experiment(ExperimentSpec.model_validate(body)).dump()
    codes = [f["code"] for f in summary["findings"]]
    assert "checkpointing_keeps_more" not in codes, summary["findings"]
    if checkpoint["strategy"] == "sequential":  # segments=1 is strategy none, to the byte
        assert summary["activation_bytes"] == summary["reference_activation_bytes"]


@pytest.mark.parametrize("depth", [8, 32])
def test_a_dropout_mask_drawn_again_is_caught_however_small_the_gradients(depth):
    # preserve_rng_state=False with dropout: recomputation draws other masks. At depth 32
    # the checkpointed half's gradients are below 1e-8; an absolute floor of 1e-7 hid them.
    body = spec_dict(steps=2, batch_size=8, model={"kind": "mlp", "depth": depth, "width": 32, "dropout": 0.2})
    body["checkpoint"] = {**body["checkpoint"], "strategy": "per_block", "preserve_rng_state": False}
    summary = run_experiment(ExperimentSpec.model_validate(body)).dump()
    assert summary["gradients_match"] is False and summary["gradient_verdict"] == "differ"
    assert summary["grad_worst_param"] is not None and summary["grad_mismatch_count"] > 0


def test_a_model_in_hand_is_trained_as_copies_and_its_depth_checked():
    from ckptlab.worker.models.build import build_model

    spec = make_spec(**{"checkpoint.strategy": "sequential", "checkpoint.segments": 2})
    torch.manual_seed(1)
    model = build_model(spec.model)
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    summary = run_experiment(spec, model=model).dump()
    assert summary["gradients_match"] is True
    assert summary["param_count"] == sum(p.numel() for p in model.module.parameters())
    # the model in hand is never changed: the engine and the gradient check train copies
    assert all(torch.equal(before[k], v) for k, v in model.module.state_dict().items())
    assert not any(type(b).__name__ == "CheckpointedGroup" for b in model.blocks)
    with pytest.raises(RunError, match="has 8 blocks but model.depth is 4"):
        run_experiment(make_spec(**{"model.depth": 4}), model=model).dump()
