"""Strategy ``auto`` in prediction mode: on a GPU target the plan made from fake profiles
keeps the predicted peak under the budget (by default the target's capacity less context,
cuBLAS workspace and a margin); on ``cpu`` the predicted plan, run for real, measures under
its budget; and a budget below the fixed memory fails up front, naming it per parameter."""

from __future__ import annotations

import pytest
import torch

from ckptlab.prediction.budget import BUDGET_MARGIN
from ckptlab.prediction.targets import CPU_TARGET, Target, registered
from ckptlab.strategies import get_strategy
from ckptlab.worker.engine.context import RunContext
from ckptlab.worker.engine.summarize import summarize
from ckptlab.worker.errors import RunError
from ckptlab.worker.measure.meter import Meter
from ckptlab.worker.predict import default_budget_bytes, predict_run
from tests.factories import make_spec

MiB = 1024**2
GPT = {"kind": "transformer", "depth": 8, "d_model": 128, "heads": 2, "seq_len": 256, "vocab_size": 500}
MLP = {"kind": "mlp", "depth": 12, "width": 128}


def test_the_default_budget_leaves_context_workspace_and_a_margin():
    small = Target(
        "small-gpu", "small", "cuda", 1000 * MiB, (9, 0), cublas_workspace_bytes=32 * MiB, context_bytes=600 * MiB
    )
    # two workspaces: forward's thread and autograd's backward thread each hold one
    assert default_budget_bytes(small) == 1000 * MiB - 600 * MiB - 64 * MiB - int(BUDGET_MARGIN * 1000 * MiB)
    assert default_budget_bytes(small, 2000 * MiB) == 2000 * MiB - 664 * MiB - int(BUDGET_MARGIN * 2000 * MiB)
    assert default_budget_bytes(CPU_TARGET) is None


def test_on_a_gpu_target_the_plan_keeps_the_peak_under_the_budget():
    workspace, context = 32 * MiB, 600 * MiB
    base = {"model": GPT, "batch_size": 8, "steps": 3, "amp": "bf16"}
    # A made-up card whose default budget is 80% of the un-checkpointed step's peak.
    probe = Target("probe-gpu", "probe", "cuda", 2**40, (9, 0), cublas_workspace_bytes=workspace, context_bytes=context)
    with registered(probe):
        none_peak = predict_run(make_spec(**base), probe).peak_allocated_bytes
    capacity = int((0.8 * none_peak + context + 2 * workspace) / (1 - BUDGET_MARGIN)) + 1
    small = Target(
        "small-gpu", "small", "cuda", capacity, (9, 0), cublas_workspace_bytes=workspace, context_bytes=context
    )
    with registered(small):
        budget = default_budget_bytes(small)
        assert budget == pytest.approx(0.8 * none_peak, rel=0.001)
        auto = make_spec(**base, **{"checkpoint.strategy": "auto", "checkpoint.budget_bytes": budget})
        summary = predict_run(auto, small)
    assert summary.budget_bytes == budget
    assert summary.plan["checkpointed_blocks"], "a budget under the un-checkpointed peak needs checkpointing"
    assert summary.predicted_peak_bytes <= budget
    assert summary.peak_allocated_bytes <= budget  # the fake run of the plan, workspace included
    assert summary.prediction.fits is True
    notes = " ".join(summary.prediction.notes)
    assert "forward FLOPs" in notes and "without checkpointing before it plans" in notes


def test_on_cpu_the_predicted_plan_run_for_real_measures_under_its_budget():
    base = {"model": MLP, "batch_size": 2048, "steps": 3, "verify_gradients": False}
    none_peak = predict_run(make_spec(**base), CPU_TARGET).peak_allocated_bytes
    budget = int(0.8 * none_peak)
    spec = make_spec(**base, **{"checkpoint.strategy": "auto", "checkpoint.budget_bytes": budget})
    predicted = predict_run(spec, CPU_TARGET)
    ranges = [(start, end) for start, end, checkpointed in predicted.plan["segments"] if checkpointed]
    assert ranges and predicted.peak_allocated_bytes <= budget
    # The predicted plan, run for real by the engine (its build and memory pass).
    dev = torch.device("cpu")
    meter = Meter(dev, None)
    run = RunContext(spec, get_strategy("auto"), dev, meter, {"phase": "setup", "step": 0}, None)
    with meter.mode():
        run.build(None, ranges)
        run.memory_pass()
    real = summarize(run)
    assert real.peak_allocated_bytes <= budget
    assert real.peak_allocated_bytes == predicted.peak_allocated_bytes  # exact on CPU


def test_a_budget_below_the_fixed_memory_fails_up_front_naming_it_per_parameter():
    spec = make_spec(
        model=MLP,
        optimizer="adamw",
        **{"checkpoint.strategy": "auto", "checkpoint.budget_bytes": 1 * MiB},
    )
    with pytest.raises(RunError, match=r"16 B per parameter .*sharding") as caught:
        predict_run(spec, CPU_TARGET)
    params = caught.value.details["param_count"]
    assert params == 13 * (128 * 128 + 128) + (128 * 10 + 10)
    assert caught.value.details["fixed_bytes"] == 16 * params


def test_a_prediction_with_search_compile_says_it_planned_eager_only():
    spec = make_spec(
        model=MLP,
        batch_size=64,
        **{"checkpoint.strategy": "auto", "checkpoint.budget_bytes": 10**9, "checkpoint.search_compile": True},
    )
    summary = predict_run(spec, CPU_TARGET)
    assert "compiled" not in summary.plan  # nothing compiles on fake tensors
    assert any("search_compile" in w and "eager plan" in w for w in summary.warnings)
