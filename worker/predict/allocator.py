"""A small model of the CUDA caching allocator, replaying a run's allocations and frees to
predict its reserved bytes.

The rules, from PyTorch's ``c10/cuda/CUDACachingAllocator.cpp`` (defaults: no
``max_split_size_mb``, no expandable segments, one stream):

- every block is a multiple of 512 B (the tracker has already rounded the sizes);
- blocks of at most 1 MiB come from the small pool, larger ones from the large pool;
- a new segment (``cudaMalloc``) is 2 MiB for a small block, 20 MiB for a block under
  10 MiB, else the request rounded up to 2 MiB;
- a request takes the smallest free block of its pool that is large enough (best fit;
  ties by segment, then offset: PyTorch compares addresses), split when the remainder is
  at least 512 B (small pool) or more than 1 MiB (large pool);
- a freed block merges with free neighbours of its segment; segments are never released.

Left out, and why it is an approximation: the allocator frees its cached segments and
retries before it reports out of memory (so a reserved peak above the capacity may still
run, fragmented), segments are per stream, and ``empty_cache`` is never called here.

Example usage::

    sim = CachingAllocatorModel()
    for key, nbytes in tracker_events:  # (storage, +bytes) at allocation, (storage, -bytes) at free
        sim.replay(key, nbytes)
    sim.peak_reserved_bytes
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

__all__ = ["CachingAllocatorModel", "peak_reserved_bytes"]

MiB = 1024**2
SMALL_SIZE = 1 * MiB  # kSmallSize: the small pool's largest block
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: a small-pool segment
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: below it, a large block gets a 20 MiB segment
LARGE_BUFFER = 20 * MiB  # kLargeBuffer
ROUND_LARGE = 2 * MiB  # kRoundLarge
MIN_BLOCK = 512  # kMinBlockSize


class _Block:
    __slots__ = ("size", "seg", "offset", "prev", "next", "free", "small")

    def __init__(self, size: int, seg: int, offset: int, small: bool):
        self.size, self.seg, self.offset, self.small = size, seg, offset, small
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.free = True


def segment_bytes(size: int) -> int:
    """Bytes of the segment ``cudaMalloc`` gets for a block of ``size`` bytes."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingAllocatorModel:
    """Replays allocations and frees (see the module docstring).

    Attributes:
        reserved_bytes: bytes of the segments made so far (never released).
        peak_reserved_bytes: the same (reserved only grows); kept for readability.
        allocated_bytes: bytes of the blocks in use now (rounded sizes).
        segments: how many segments were made.
    """

    def __init__(self) -> None:
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.segments = 0
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # small? -> sorted
        self._by_place: dict[tuple[int, int], _Block] = {}  # (segment, offset) -> free block
        self._used: dict[int, _Block] = {}  # the caller's key -> block in use

    @property
    def peak_reserved_bytes(self) -> int:
        """The most bytes reserved at any time (segments are never released)."""
        return self.reserved_bytes

    def replay(self, key: int, nbytes: int) -> None:
        """Allocate ``nbytes`` for ``key`` (positive), or free ``key``'s block (negative).
        A free of an unknown key, and an allocation of 0 bytes, do nothing."""
        if nbytes > 0:
            self.malloc(key, nbytes)
        elif nbytes < 0:
            self.release(key)

    def malloc(self, key: int, size: int) -> None:
        """Give ``key`` a block of ``size`` bytes (rounded up to 512)."""
        size = max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):
            block = self._take(pool[i])
        else:
            seg_size = segment_bytes(size)
            self.reserved_bytes += seg_size
            block = _Block(seg_size, self.segments, 0, small)
            self.segments += 1
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = _Block(remaining, block.seg, block.offset + size, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._put(rest)
        block.free = False
        self._used[key] = block
        self.allocated_bytes += block.size

    def release(self, key: int) -> None:
        """Return ``key``'s block to its pool, merged with free neighbours."""
        block = self._used.pop(key, None)
        if block is None:
            return
        self.allocated_bytes -= block.size
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._take((neighbour.size, neighbour.seg, neighbour.offset))
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._put(block)

    def _put(self, block: _Block) -> None:
        block.free = True
        bisect.insort(self._free[block.small], (block.size, block.seg, block.offset))
        self._by_place[(block.seg, block.offset)] = block

    def _take(self, entry: tuple[int, int, int]) -> _Block:
        size, seg, offset = entry
        block = self._by_place.pop((seg, offset))
        pool = self._free[block.small]
        del pool[bisect.bisect_left(pool, entry)]
        return block


def peak_reserved_bytes(events: Iterable[tuple[int, int]]) -> int:
    """The reserved bytes after replaying ``events`` (``(key, +bytes)`` allocations and
    ``(key, -bytes)`` frees, in order) through :class:`CachingAllocatorModel`."""
    sim = CachingAllocatorModel()
    for key, nbytes in events:
        sim.replay(key, nbytes)
    return sim.peak_reserved_bytes
