"""The CPU allocator probe (worker/allocator_probe.py) against known allocations and the
exact live-tensor tracker."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from worker.allocator_probe import CpuAllocatorProbe
from worker.memory import LiveTensorTracker, SimulatedOutOfMemoryError


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
