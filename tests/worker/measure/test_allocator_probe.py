"""The CPU allocator probe (worker/measure/allocator_probe.py) against known allocations and the
exact live-tensor tracker."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ckptlab.worker.measure.allocator_probe import CpuAllocatorProbe
from ckptlab.worker.measure.memory import LiveTensorTracker, SimulatedOutOfMemoryError


def test_counts_an_allocation_and_its_free():
    with CpuAllocatorProbe() as probe:
        start = probe.live_bytes
        a = torch.empty(1000, dtype=torch.float32)
        assert probe.live_bytes - start == 4000
        probe.reset_peak()
        b = torch.empty(500, dtype=torch.float64)
        del b
        assert probe.live_bytes - start == 4000
        assert probe.peak_bytes - start == 8000
        del a
        assert probe.live_bytes == start


def test_a_free_of_a_block_from_before_the_probe_is_not_counted():
    """PyTorch's memory reporter remembers a block's size across profiling sessions, so a
    later session reports its free; the probe counts only blocks allocated while entered."""
    with CpuAllocatorProbe():
        old = torch.empty(1000)  # allocated under an earlier session: its size is known
    with CpuAllocatorProbe() as probe:
        start = probe.live_bytes
        new = torch.empty(500)
        del old
        assert probe.live_bytes - start == 2000
        assert probe.peak_bytes - start == 2000
        del new
        assert probe.live_bytes == start


def test_limit_is_checked_at_a_reading():
    with CpuAllocatorProbe(limit_bytes=1000) as probe:
        keep = torch.empty(1000)
        with pytest.raises(SimulatedOutOfMemoryError):
            _ = probe.live_bytes
        del keep


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.Dropout(0.1)) for _ in range(4)))


def _step(probe, model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(bytes a forward leaves, peak of forward and backward above the start)."""
    probe.reset_peak()
    start = probe.live_bytes
    loss = model(x).square().mean()
    kept = probe.live_bytes - start
    loss.backward()
    return kept, probe.peak_bytes - start


def test_agrees_with_the_exact_tracker_on_eager_code():
    """Eager code allocates only tensors here: the allocator and the tracker count the same
    bytes (what a forward keeps, and the forward-and-backward peak)."""
    x = torch.randn(32, 128)
    with LiveTensorTracker() as tracker:
        model = _mlp()
        exact = _step(tracker, model, x)
    with CpuAllocatorProbe() as probe:
        model = _mlp()
        read = _step(probe, model, x)
    assert exact[0] > 0
    assert read == exact


def test_the_exact_tracker_counts_the_rng_state_each_checkpoint_keeps():
    """``torch.get_rng_state()`` is built outside the dispatcher; the tracker counts it anyway
    (issue 19), so a checkpointed forward reads what the allocator holds."""
    x = torch.randn(32, 128)
    kept = {}
    gc.collect()  # no earlier test's garbage, and no collection inside a window
    gc.disable()
    try:
        for preserve in (True, False):
            for probe_type in (LiveTensorTracker, CpuAllocatorProbe):
                with probe_type() as probe:
                    blocks = list(_mlp())  # made under the probe, as the engine makes its model
                    start = probe.live_bytes
                    h = x
                    for b in blocks:
                        h = checkpoint(b, h, use_reentrant=False, preserve_rng_state=preserve)
                    kept[preserve, probe_type] = probe.live_bytes - start
                    del h
    finally:
        gc.enable()
    state = torch.get_rng_state().nbytes
    assert kept[True, LiveTensorTracker] == kept[True, CpuAllocatorProbe]
    assert kept[True, LiveTensorTracker] - kept[False, LiveTensorTracker] == len(blocks) * state


def test_the_engines_activation_figure_holds_one_rng_state_per_checkpoint():
    """The MLP per_block with dropout: the summary's activation bytes hold what the test above
    shows the allocator holding, one RNG state per checkpointed block, said apart in
    ``rng_state_bytes``. (The engine cannot run eager checkpoints under the profiler probe
    itself: torch 2.13's profiler with ``profile_memory`` crashes in a recomputation.)"""
    from ckptlab.worker.engine.run import run_experiment
    from tests.factories import make_spec

    runs = {
        rng: run_experiment(
            make_spec(
                **{"model.dropout": 0.1, "checkpoint.strategy": "per_block", "checkpoint.preserve_rng_state": rng},
                verify_gradients=False,
            )
        ).dump()
        for rng in (True, False)
    }
    states = 8 * torch.get_rng_state().nbytes  # make_spec's MLP has 8 blocks
    assert runs[True]["rng_state_bytes"] == states and runs[False]["rng_state_bytes"] == 0
    assert runs[True]["activation_bytes"] - runs[False]["activation_bytes"] == states
