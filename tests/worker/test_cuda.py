"""On CUDA the allocator's counts agree with the CPU tracker's exact count (same fp32 spec),
and the timing pass keeps its memory readings there (one pass serves both)."""

from __future__ import annotations

import pytest

from ckptlab.worker.engine.run import run_experiment
from tests.factories import make_spec

pytestmark = pytest.mark.gpu

SPECS = {
    "mlp-sequential-4": {
        "model.depth": 16,
        "model.width": 512,
        "batch_size": 64,
        "checkpoint.strategy": "sequential",
        "checkpoint.segments": 4,
    },
    "mlp-none": {"model.depth": 16, "model.width": 512, "batch_size": 64},
    "mlp-per_block": {"model.depth": 16, "model.width": 512, "batch_size": 64, "checkpoint.strategy": "per_block"},
    "transformer-per_block": {
        "model": {"kind": "transformer", "depth": 4, "d_model": 128, "heads": 4, "seq_len": 64, "vocab_size": 500},
        "batch_size": 8,
        "checkpoint.strategy": "per_block",
    },
    "resnet-sequential-3": {
        "model": {"kind": "resnet", "depth": 9, "channels": 16, "image_size": 32},
        "batch_size": 8,
        "checkpoint.strategy": "sequential",
        "checkpoint.segments": 3,
    },
}


def _spec(device: str, overrides: dict):
    return make_spec(device=device, verify_gradients=False, timed_steps=3, **overrides)


@pytest.mark.parametrize("name", list(SPECS))
def test_cuda_activation_bytes_equal_the_cpu_exact_count_within_2_percent(name):
    """Less the CPU RNG states the CPU count keeps with ``preserve_rng_state`` (5,056 B per
    checkpoint): on CUDA the stashed RNG states are host tensors, outside the allocator's
    figures (the first H200 run of this test, 2026-11-26, measured per_block 3.5% under the
    CPU count: 16 states, 80,896 B)."""
    cpu = run_experiment(_spec("cpu", SPECS[name])).dump()
    cuda = run_experiment(_spec("cuda", SPECS[name])).dump()
    assert cuda["rng_state_bytes"] == 0
    expected = cpu["activation_bytes"] - cpu["rng_state_bytes"]
    ratio = cuda["activation_bytes"] / expected
    print(f"{name}: cpu {cpu['activation_bytes']} (rng {cpu['rng_state_bytes']}) cuda {cuda['activation_bytes']}")
    assert 0.98 <= ratio <= 1.02


def test_the_cuda_timing_pass_keeps_its_memory_readings():
    records: list[dict] = []
    summary = run_experiment(_spec("cuda", SPECS["mlp-none"]), on_step=records.append).dump()
    timed = [r for r in records if r["extra"]["pass"] == "timed"]
    assert len(timed) == 3 and all(r["peak_allocated_bytes"] > 0 for r in timed)
    assert summary["timing_pass"] == "timed" and summary["timing"]["step_ms"]["n"] == 3


def test_a_checkpointed_cuda_run_is_paired_on_cuda_event_times():
    """Paired rounds on CUDA: wall times from CUDA events (no per-phase synchronize), the
    summary's rounds judged by wall time; per-block recomputation is not faster."""
    from ckptlab.summary import RunSummary

    spec = make_spec(device="cuda", verify_gradients=False, timed_steps=10, **SPECS["mlp-per_block"])
    summary = RunSummary.load(run_experiment(spec).dump())
    base, run, clock = summary.paired_rounds()
    assert clock == "wall time" and len(base) == len(run) == 10
    assert all(t > 0 for t in base + run)
