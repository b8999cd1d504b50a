"""What glibc's heap does to a CPU step and to checkpointing's measured overhead (issue 31):
the built-in DenseNet (4 layers, growth 16, 32 px, batch 16; Adam; one torch thread),
un-checkpointed and checkpointed per block (``torch.utils.checkpoint``, non-reentrant),
each step's process CPU time and minor page faults (``getrusage``), in a fresh process per
heap: glibc's defaults, and freed memory kept
(:func:`ckptlab.worker.measure.heap.keep_freed_heap`, what ``run_experiment`` sets).
Steps interleaved (plain and checkpointed alternate which goes first), 3 warm-up pairs;
per heap the medians and the paired overhead: the median of the per-pair CPU-time ratios
with its bootstrap 95% CI (:func:`ckptlab.analysis.stats.paired_ratio_ci`).

Usage: python bench/bench_heap.py [--pairs N]   (prints a Markdown table)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(heap: str, pairs: int) -> dict:
    """In this process (a fresh one per heap): ``pairs`` interleaved pairs of steps, their
    CPU ms and minor faults."""
    import resource
    import time

    import torch
    from torch.utils.checkpoint import checkpoint

    if heap == "kept":
        from ckptlab.worker.measure.heap import keep_freed_heap

        assert keep_freed_heap()
    from ckptlab.spec.models import DenseNetSpec
    from ckptlab.worker.models.builtin import build_densenet

    torch.set_num_threads(1)
    torch.manual_seed(0)
    built = build_densenet(DenseNetSpec(kind="densenet", depth=4, growth_rate=16, bn_size=4, image_size=32))
    stem, _, head = built.module.children()
    opt = torch.optim.Adam(built.module.parameters())
    x, y = built.make_batch(16, torch.Generator().manual_seed(0))

    def step(ckpt: bool) -> tuple[float, int]:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
        h = stem(x)
        for b in built.blocks:
            h = checkpoint(b, h, use_reentrant=False) if ckpt else b(h)
        torch.nn.functional.cross_entropy(head(h), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return (time.process_time() - t0) * 1e3, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0

    for _ in range(3):
        step(False), step(True)
    runs: dict[bool, list[tuple[float, int]]] = {False: [], True: []}
    for i in range(pairs):
        for ckpt in (False, True) if i % 2 else (True, False):
            runs[ckpt].append(step(ckpt))
    return {str(k): v for k, v in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.pairs)))
        return
    sys.path.insert(0, str(ROOT))
    from ckptlab.analysis.stats import paired_ratio_ci

    print(f"<!-- {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, {args.pairs} pairs -->")
    print("| heap | un-checkpointed step (CPU ms) | minor faults | per_block step | minor faults | overhead, paired |")
    print("|---|---:|---:|---:|---:|---|")
    for heap in ("default", "kept"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", heap, "--pairs", str(args.pairs)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        runs = json.loads(out.stdout.strip().splitlines()[-1])
        plain, ckpt = runs["False"], runs["True"]
        ci = paired_ratio_ci([p[0] for p in plain], [c[0] for c in ckpt])
        med = statistics.median
        print(
            f"| {heap} | {med(p[0] for p in plain):.0f} | {med(p[1] for p in plain):,.0f} | "
            f"{med(c[0] for c in ckpt):.0f} | {med(c[1] for c in ckpt):,.0f} | "
            f"{ci.estimate_pct:+.1f}% [{ci.low_pct:+.1f}, {ci.high_pct:+.1f}] |"
        )


if __name__ == "__main__":
    main()
