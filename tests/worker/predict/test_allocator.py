"""The model of the CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp's rules):
segment sizes per pool, best-fit reuse, splitting, merging, segments never released."""

from __future__ import annotations

from ckptlab.worker.predict.allocator import CachingAllocatorModel, peak_reserved_bytes, segment_bytes

MiB = 1024**2


def test_segment_sizes_follow_the_pools():
    assert segment_bytes(512) == segment_bytes(1 * MiB) == 2 * MiB  # small pool
    assert segment_bytes(1 * MiB + 512) == segment_bytes(10 * MiB - 512) == 20 * MiB  # large, under 10 MiB
    assert segment_bytes(10 * MiB) == 10 * MiB and segment_bytes(11 * MiB) == 12 * MiB  # rounded to 2 MiB


def test_small_blocks_share_a_segment_and_are_rounded_to_512():
    sim = CachingAllocatorModel()
    for key in range(4):
        sim.malloc(key, 100)  # 512 B each
    assert sim.allocated_bytes == 4 * 512 and sim.reserved_bytes == 2 * MiB and sim.segments == 1
    sim.malloc(10, 2 * MiB - 4 * 512)  # the rest of the segment... is over 1 MiB: the large pool
    assert sim.segments == 2


def test_a_freed_block_is_reused_best_fit_and_merged_with_free_neighbours():
    sim = CachingAllocatorModel()
    sim.malloc(1, 4 * MiB)  # a 20 MiB segment, split: 4 MiB used, 16 MiB free
    sim.malloc(2, 4 * MiB)  # from the free 16 MiB
    assert (sim.segments, sim.reserved_bytes) == (1, 20 * MiB)
    sim.release(1)
    sim.malloc(3, 3 * MiB)  # best fit: the freed 4 MiB (not the 12 MiB rest); its 1 MiB rest is not split off
    assert sim.reserved_bytes == 20 * MiB and sim.allocated_bytes == 8 * MiB
    sim.release(2)
    sim.release(3)  # every block free again: one 20 MiB block
    sim.malloc(4, 20 * MiB)
    assert (sim.segments, sim.reserved_bytes) == (1, 20 * MiB)


def test_segments_are_never_released_and_a_free_of_an_unknown_key_is_ignored():
    events = [(1, 30 * MiB), (1, -30 * MiB), (2, 40 * MiB), (2, -40 * MiB), (99, -512)]
    assert peak_reserved_bytes(events) == 70 * MiB  # 30 MiB cannot hold 40 MiB: a second segment
    assert peak_reserved_bytes([(1, 40 * MiB), (1, -40 * MiB), (2, 30 * MiB)]) == 40 * MiB
