"""What a run tells the user beyond bytes: timings from a pass without instrumentation,
where the peak is, settings that do nothing or backfire, and a per-parameter gradient
verdict."""

from __future__ import annotations

import pytest

from ckptlab.worker.engine.run import run_experiment
from tests.factories import make_spec

WIDE = {"model.depth": 16, "model.width": 256, "batch_size": 64}


def _run(**overrides):
    records: list[dict] = []
    summary = run_experiment(make_spec(**overrides), on_step=records.append).dump()
    return summary, records


def test_the_timing_pass_follows_the_memory_pass_without_memory_readings_on_cpu():
    summary, records = _run(steps=3, timed_steps=5)
    assert [r["step"] for r in records] == list(range(1, 9))
    assert [r["extra"]["pass"] for r in records] == ["memory"] * 3 + ["timed"] * 5
    assert all(r["allocated_bytes"] is None and r["peak_allocated_bytes"] is None for r in records[3:])
    assert all(r["peak_allocated_bytes"] > 0 for r in records[:3])
    assert summary["timing_pass"] == "timed" and len(summary["step_times_ms"]) == 5
    spread = summary["timing"]["step_ms"]
    assert spread["n"] == 5 and spread["ci_low"] <= spread["median"] <= spread["ci_high"]
    assert summary["step_time_ms"] == spread["median"]
    assert summary["peak_allocated_bytes"] == max(r["peak_allocated_bytes"] for r in records[:3])


def test_without_timed_steps_the_timings_come_from_the_memory_steps():
    summary, records = _run(steps=3, timed_steps=0)
    assert len(records) == 3 and summary["timing_pass"] == "memory" and summary["timing"]["step_ms"]["n"] == 2


def test_an_adam_peak_in_the_optimizer_step_is_named_and_checkpointing_is_ruled_out():
    summary, _ = _run(**WIDE, optimizer="adam", **{"checkpoint.strategy": "sequential", "checkpoint.segments": 4})
    assert summary["peak_phase"] == "optimizer" and summary["activation_bytes_at_peak"] == 0
    assert summary["memory_at_peak"]["optimizer_state"] > 0
    assert "is in optimizer.step" in summary["peak_explanation"]
    assert "checkpointing cannot lower this peak" in summary["peak_explanation"]
    assert "peak_not_in_activations" in [f["code"] for f in summary["findings"]]


def test_a_peak_that_holds_activations_says_how_much_checkpointing_can_take_off():
    summary, _ = _run(**{**WIDE, "batch_size": 512}, optimizer="sgd", warmup_steps=0, steps=2)
    assert summary["peak_phase"] in ("forward", "backward") and summary["activation_bytes_at_peak"] > 0
    assert "checkpointing can take at most" in summary["peak_explanation"]


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"checkpoint.strategy": "offload"}, "offload_on_cpu"),
        ({"checkpoint.strategy": "sequential", "checkpoint.segments": 1}, "sequential_equals_none"),
        (
            {"checkpoint.strategy": "per_block", "checkpoint.every": 1, "model.stem": False},
            "checkpointing_saves_nothing",
        ),
        ({"checkpoint.strategy": "selective", "checkpoint.policy": "save_matmuls"}, "checkpointing_keeps_more"),
    ],
)
def test_a_setting_that_does_nothing_or_backfires_is_a_finding_and_a_warning(overrides, code):
    summary, _ = _run(**WIDE, **overrides)
    found = {f["code"]: f["message"] for f in summary["findings"]}
    assert code in found
    assert f"ckptlab: {found[code]}" in summary["warnings"]


def test_a_real_saving_is_no_finding():
    summary, _ = _run(**WIDE, **{"checkpoint.strategy": "sequential", "checkpoint.segments": 4})
    codes = {f["code"] for f in summary["findings"]}
    assert not codes & {"checkpointing_saves_nothing", "checkpointing_keeps_more", "sequential_equals_none"}
    assert summary["activation_bytes"] < 0.6 * summary["reference_activation_bytes"]


def test_dropout_without_rng_preservation_fails_the_check_and_names_a_parameter():
    summary, _ = _run(
        **{"model.dropout": 0.5, "checkpoint.strategy": "sequential", "checkpoint.segments": 4},
        **{"checkpoint.preserve_rng_state": False},
    )
    assert summary["gradients_match"] is False and summary["grad_mismatch_count"] >= 1
    assert summary["grad_worst_param"] and summary["grad_worst_rel_error"] > 1e-4


def test_reentrant_checkpointing_of_an_input_without_grad_loses_parameter_gradients():
    summary, _ = _run(
        **{"model.stem": False, "checkpoint.strategy": "sequential", "checkpoint.segments": 2},
        **{"checkpoint.use_reentrant": True},
    )
    assert summary["gradients_match"] is False
    assert summary["params_missing_grad"] and summary["grad_worst_param"] in summary["params_missing_grad"]


@pytest.mark.parametrize(
    ("pitfall", "fixed"),
    [
        ({"checkpoint.preserve_rng_state": False}, {"checkpoint.preserve_rng_state": True}),
        (
            {"checkpoint.use_reentrant": True, "model.stem": False},
            {"checkpoint.use_reentrant": False, "model.stem": False},
        ),
    ],
)
def test_the_same_spec_without_the_pitfall_matches(pitfall, fixed):
    base = {"model.dropout": 0.5, "checkpoint.strategy": "sequential", "checkpoint.segments": 2}
    bad, _ = _run(**base, **pitfall)
    good, _ = _run(**base, **fixed)
    assert bad["gradients_match"] is False and bad["grad_worst_param"]
    assert good["gradients_match"] is True and good["grad_mismatch_count"] == 0 and good["grad_worst_param"] is None


def test_without_warmup_adams_state_is_counted_as_optimizer_state_at_the_peak():
    summary, records = _run(**WIDE, optimizer="adam", warmup_steps=0, steps=2, timed_steps=0)
    assert summary["peak_phase"] == "optimizer"
    params = summary["memory_at_peak"]["parameters"]
    # Adam keeps exp_avg and exp_avg_sq (twice the parameter bytes) and a scalar step each,
    # tagged as it creates them in the first step, so none of it is counted as "other"
    for at_peak in (summary["memory_at_peak"], records[0]["extra"]["memory_at_peak"]):
        assert 2 * params <= at_peak["optimizer_state"] < 2 * params + 4096
        assert at_peak["other"] < params


@pytest.mark.parametrize("depth", [8, 32, 64])
def test_a_redrawn_dropout_mask_is_named_by_the_first_group_whose_recomputation_differs(depth):
    """Issue 19: without RNG preservation a deep MLP's dropout masks are drawn again in the
    recomputation; the check compares each checkpointed group's recomputed output with its
    first forward's, so the run does not match whatever its gradients' scale, and it names
    the first group that differs (the first checkpointed one: every group has dropout)."""
    base = {"model.depth": depth, "model.width": 32, "model.dropout": 0.5, "checkpoint.strategy": "per_block"}
    bad, _ = _run(**base, **{"checkpoint.preserve_rng_state": False})
    assert bad["gradients_match"] is False and bad["gradient_verdict"] == "differ"
    assert bad["recompute_verdict"] == "differ"
    group = bad["recompute_first_differing_group"]
    assert (group["start"], group["end"]) == (0, 1) and group["max_abs_diff"] > 0
    good, _ = _run(**base, **{"checkpoint.preserve_rng_state": True})
    assert good["recompute_verdict"] == "match" and good.get("recompute_first_differing_group") is None
