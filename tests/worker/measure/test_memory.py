import gc

import pytest
import torch

from ckptlab.worker.measure.memory import LiveTensorTracker, SimulatedOutOfMemoryError


def test_counts_new_storages_and_releases_them():
    with LiveTensorTracker() as tracker:
        a = torch.empty(1000, dtype=torch.float32)
        assert tracker.live_bytes == 4000
        b = a.view(10, 100)  # a view shares the storage: not counted again
        c = torch.ones(250, dtype=torch.float64)
        assert tracker.live_bytes == 4000 + 2000
        del a, b
        gc.collect()
        assert tracker.live_bytes == 2000
        assert tracker.peak_bytes == 6000
        tracker.reset_peak()
        assert tracker.peak_bytes == 2000
        del c


def test_temporaries_show_in_peak_not_live():
    x = torch.randn(100, 100)
    with LiveTensorTracker() as tracker:
        y = (x * 2).sum()  # (100, 100) temporary freed at once
        assert tracker.live_bytes == y.untyped_storage().nbytes()
        assert tracker.peak_bytes >= 100 * 100 * 4


def test_limit_raises_simulated_oom():
    with pytest.raises(SimulatedOutOfMemoryError) as ei:
        with LiveTensorTracker(limit_bytes=10_000):
            keep = [torch.empty(1000) for _ in range(3)]  # 12,000 bytes
            del keep
    assert ei.value.limit_bytes == 10_000 and ei.value.live_bytes > 10_000
