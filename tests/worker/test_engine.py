import math

import pytest

from tests.factories import make_spec
from worker.engine import resolve_device, run_experiment


def run(**overrides):
    steps = []
    summary = run_experiment(make_spec(**overrides), on_step=steps.append)
    return summary, steps


def test_records_every_step_with_consistent_timings():
    summary, steps = run(steps=4)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    for s in steps:
        assert s["step_ms"] == pytest.approx(s["forward_ms"] + s["backward_ms"] + s["optimizer_ms"], rel=1e-6)
        assert 0 < s["allocated_bytes"] <= s["peak_allocated_bytes"]
        assert s["reserved_bytes"] is None  # CPU
    assert summary["device"] == "cpu"
    assert summary["params_without_grad"] == 0
    assert summary["torch_version"].startswith("2.")
    assert math.isfinite(summary["final_loss"])


def test_activation_bytes_match_retained_relu_outputs_without_checkpointing():
    # depth 8 blocks + stem each keep one (16, 64) float32 ReLU output; the head output and
    # the loss add a little.
    summary, _ = run()
    per_block = 16 * 64 * 4
    assert 9 * per_block <= summary["activation_bytes"] <= 9 * per_block + 8192


def test_checkpointing_saves_activation_memory():
    none, _ = run()
    seq4, _ = run(**{"checkpoint.strategy": "sequential", "checkpoint.segments": 4})
    assert seq4["activation_bytes"] < 0.75 * none["activation_bytes"]


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_sequential_runs_with_each_option(reentrant, amp):
    summary, steps = run(
        amp=amp,
        **{"checkpoint.strategy": "sequential", "checkpoint.segments": 2, "checkpoint.use_reentrant": reentrant},
    )
    assert len(steps) == 3
    assert summary["params_without_grad"] == 0


def test_cuda_request_without_cuda_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
