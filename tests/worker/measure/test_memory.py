import gc

import pytest
import torch

from ckptlab.worker.measure.memory import CudaProbe, LiveTensorTracker, SimulatedOutOfMemoryError


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


def test_a_storage_resized_in_place_counts_at_its_new_size_and_regrown_takes_the_current_category():
    # FSDP2 frees all-gathered parameters by resizing their storage to 0 and re-allocates
    # them by resizing it back (UntypedStorage.resize_, which no dispatch mode sees).
    tracker = LiveTensorTracker()
    original = torch.UntypedStorage.resize_
    with tracker:
        tracker.category = "parameters"
        t = torch.empty(1024)
        before = tracker.live_bytes
        t.untyped_storage().resize_(0)
        assert tracker.live_bytes == before - 4096
        tracker.category = "unsharded_parameters"
        t.untyped_storage().resize_(2048)
        assert tracker.live_bytes == before - 4096 + 2048
        assert tracker.by_category["unsharded_parameters"] == 2048 and tracker.by_category["parameters"] == 0
        assert tracker.peak_bytes == before
    assert torch.UntypedStorage.resize_ is original  # put back on exit


def test_a_wrapper_subclass_is_counted_by_the_tensors_it_wraps():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        tracker = LiveTensorTracker()
        with tracker:
            tracker.category = "parameters"
            d = distribute_tensor(torch.ones(64, 4), mesh, [Shard(0)])
            local = d.to_local()
            assert tracker.by_category["parameters"] >= local.untyped_storage().nbytes()
            tracker.retag(d, "gradients")
            assert tracker.by_category["gradients"] == local.untyped_storage().nbytes()
    finally:
        dist.destroy_process_group()


def test_a_device_type_counts_only_that_devices_storages():
    # a CUDA run's timeline tracker: the batch made on the host is not device memory
    with LiveTensorTracker(device_type="cuda") as tracker:
        x = torch.ones(1000)
        assert tracker.live_bytes == 0
    with LiveTensorTracker(device_type="cpu") as tracker:
        y = torch.ones(1000)
        assert tracker.live_bytes == 4000
    del x, y


def test_bytes_no_tensor_holds_count_as_one_block_replaced_at_each_count():
    # (the allocator's bytes less the tensors' blocks: counted as given, already whole blocks)
    tracker = LiveTensorTracker(block_bytes=512)
    tracker.set_untracked(3072, "other")
    assert tracker.live_bytes == 3072 and tracker.by_category["other"] == 3072
    tracker.set_untracked(1024, "other")
    assert tracker.live_bytes == 1024 and tracker.peak_bytes == 3072
    tracker.set_untracked(0, "other")
    assert tracker.live_bytes == 0 and tracker.by_category["other"] == 0


class _Allocator:
    """The CUDA caching allocator's three statistics the probe reads, without a GPU."""

    def __init__(self):
        self.allocated = self.peak = 0

    def allocate(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def reset_peak(self, device=None) -> None:
        self.peak = self.allocated


def test_the_cuda_probes_windows_keep_the_peak_of_the_windows_before(monkeypatch):
    # The planner's block profile opens a window per block; the step's peak must survive them.
    alloc = _Allocator()
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: alloc.allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: alloc.peak)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", alloc.reset_peak)
    probe = CudaProbe(torch.device("cuda"))
    probe.reset_peak()
    alloc.allocate(1000)
    alloc.allocate(-600)  # a temporary of 600 B freed: the top was 1000
    probe.reset_window()
    assert (probe.live_bytes, probe.window_peak_bytes, probe.peak_bytes) == (400, 400, 1000)
    alloc.allocate(300)
    alloc.allocate(-300)
    assert (probe.window_peak_bytes, probe.peak_bytes) == (700, 1000)
    probe.reset_window()  # a window whose top is below an earlier one's keeps the earlier top
    assert (probe.window_peak_bytes, probe.peak_bytes) == (400, 1000)
    alloc.allocate(900)
    assert (probe.window_peak_bytes, probe.peak_bytes) == (1300, 1300)
    probe.reset_peak()  # a new peak forgets the earlier windows
    assert probe.peak_bytes == probe.window_peak_bytes == 1300
    alloc.allocate(-1300)
    probe.reset_peak()
    assert probe.peak_bytes == 0
