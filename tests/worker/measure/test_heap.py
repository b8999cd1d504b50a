"""The CPU heap keeps freed memory (:mod:`ckptlab.worker.measure.heap`): a step that frees
its activations and makes them again faults no pages in the second time."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Allocate 24 blocks of 1 MiB and touch them, free them, three times; print the minor page
#: faults of the third round. Under glibc's starting threshold (128 KiB, held fixed here:
#: its dynamic raise depends on what the process freed before) every block is a fresh
#: mapping: each round faults its 24 MiB in again (6,144 pages).
ROUNDS = """
import ctypes, resource, sys, torch
if sys.argv[1] == "kept":
    from ckptlab.worker.measure.heap import keep_freed_heap
    assert keep_freed_heap()
else:
    assert ctypes.CDLL(None).mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD, glibc's default
for r in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.empty(2**18).fill_(1.0) for _ in range(24)]
    del blocks
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _third_round_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_activations_are_reused_not_faulted_in_again():
    default, kept = _third_round_faults("default"), _third_round_faults("kept")
    assert default > 4_000, (default, kept)  # 24 MiB of 4 KiB pages, faulted in again
    assert kept < 500, (default, kept)  # reused from the heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_run_says_its_heap_kept_freed_memory():
    from ckptlab.worker.engine.run import run_experiment
    from tests.factories import make_spec

    summary = run_experiment(make_spec(steps=2, verify_gradients=False, timed_steps=2)).dump()
    assert summary["environment"]["cpu_heap_kept"] is True
    assert summary["host_load"]["heap_kept"] is True  # what a comparison of separate runs reads
