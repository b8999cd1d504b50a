"""The CPU heap an experiment runs on: freed memory kept in the process, as a caching
allocator keeps it (issue 31).

**Why.** PyTorch's CPU allocator takes every tensor from glibc's ``malloc``. With glibc's
defaults a block of 128 KiB or more is a fresh ``mmap`` (the threshold moves with what was
freed before, so it depends on the process's history), and the top of the heap goes back
to the kernel when more than twice that is free: every step faults its activations' pages
in again. Measured on the built-in DenseNet (4 layers, growth 16, 32 px, batch 16; one
thread, 2-core VM, 2026-11-26, ``bench/bench_heap.py``): an un-checkpointed step took
17,120 minor page faults (67 MiB) and 99 ms of CPU, 69 ms without them; checkpointed per
block it faulted 7,137. So checkpointing looked +9% dearer where its recomputation costs +32%: a
lower peak faulted fewer pages, a saving no GPU run has (CUDA's caching allocator keeps
freed blocks) and one that moved with the heap's history (the same plan measured +2% to
+33% in separate runs), which no prediction from the blocks' own times can follow.

**What.** :func:`keep_freed_heap` fixes glibc's thresholds for the process
(``mallopt``, ``man 3 mallopt``): blocks up to :data:`MMAP_THRESHOLD_BYTES` come from the
heap, and the heap is never trimmed; freed memory is reused by the next step, as the CUDA
caching allocator reuses its blocks. The live-tensor tracker's bytes are unchanged (it
counts tensors, not pages); the process's resident size stays at its high-water mark
until it ends (a worker's child ends with its run).

Known limitations:
    - glibc only (Linux): elsewhere nothing is changed and False is returned.
    - Blocks over 32 MiB (glibc's largest ``M_MMAP_THRESHOLD`` on 64-bit) are still
      mapped and unmapped each time.
    - Process-wide and for good: glibc's dynamic threshold cannot be turned back on. An
      in-process caller (a test, a benchmark, ``ckptlab.profile``) keeps the setting.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["MMAP_THRESHOLD_BYTES", "keep_freed_heap"]

#: glibc's ``mallopt`` parameters (``malloc.h``).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Blocks up to this size come from the heap: glibc's largest mmap threshold on 64-bit
#: (``HEAP_MAX_SIZE / 2``), bytes.
MMAP_THRESHOLD_BYTES = 32 * 2**20
#: ``M_TRIM_THRESHOLD`` -1: never trim (``man 3 mallopt``).
_NEVER = -1


@functools.cache
def keep_freed_heap() -> bool:
    """Keep freed memory in this process's glibc heap (see the module docstring): blocks up
    to :data:`MMAP_THRESHOLD_BYTES` from the heap, no trimming. Once per process.

    Returns:
        True when glibc took both settings, False where there is no glibc ``mallopt``.
    """
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER))
