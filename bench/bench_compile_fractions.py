"""The compiled peak as torch.compile's activation memory budget falls (issue 31): on the
built-in transformer of ``bench_auto_front.py`` (4 layers, d 128, seq 256, batch 4, CPU),
each fraction's peak as ``auto``'s compiled search reads it
(:func:`ckptlab.worker.engine.blocks.compiled.measured_compiled`: the engine's memory pass,
the CPU allocator's readings), with the blocks compiled and with the whole forward and loss
compiled (``compile_scope``). Peaks only, no timing: they read the same whatever the load.

Usage: python bench/bench_compile_fractions.py [FRACTION ...]  (default: 1.0 down to 0.5)
Prints a Markdown table.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_auto_front import spec  # noqa: E402

from ckptlab.strategies import CompileScope  # noqa: E402
from ckptlab.worker.engine.blocks.compiled import measured_compiled  # noqa: E402

DEFAULT = (1.0, 0.95, 0.8, 0.72, 0.7, 0.68, 0.66, 0.64, 0.63, 0.62, 0.61, 0.6, 0.59, 0.57, 0.55, 0.5)


def main() -> None:
    fractions = [float(a) for a in sys.argv[1:]] or list(DEFAULT)
    print("| activation_memory_budget | peak, blocks (B) | peak, step (B) | compile + memory pass (s) |")
    print("|---:|---:|---:|---:|")
    for f in fractions:
        t0 = time.perf_counter()
        peaks = []
        for scope in (CompileScope.BLOCKS, CompileScope.STEP):
            run = measured_compiled(spec(0), torch.device("cpu"), None, f, scope, timed=False)
            peaks.append(max(r["peak_allocated_bytes"] for r in run.records[run.spec.warmup_steps :] or run.records))
        print(f"| {f} | {peaks[0]:,} | {peaks[1]:,} | {time.perf_counter() - t0:.1f} |", flush=True)


if __name__ == "__main__":
    main()
