"""Paired timing on a busy host (issue 19): how often identical work reads as "no
measurable difference" and a real recomputation overhead as measurable.

Each repeat runs, in this process, three runs of ``sequential`` 1 (the same work as
``none``: PyTorch never checkpoints the last segment) and one run of ``per_block`` (every
block recomputed; about +30% per step on the MLP 32x512) on the MLP 32x512, batch 64,
20 timed steps each; every run's timed steps are paired rounds with an un-checkpointed
copy in its process. The verdict is the product's: :meth:`ckptlab.summary.RunSummary.paired_rounds`
(CPU time on CPU) judged by :func:`ckptlab.analysis.stats.paired_ratio_ci` with the default noise
threshold. With ``--load``, one spinning process per core runs throughout. ``--threads``
sets the run's torch threads (its memory pass); the timing pass runs on the product's
``timing_cpu_threads`` (default 1) whatever it is.

Usage: python bench/bench_paired.py [--repeats N] [--threads T] [--load]
Prints a Markdown table row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from ckptlab.analysis.stats import NOISE_THRESHOLD_PCT, RatioInterval, paired_ratio_ci  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.summary import RunSummary  # noqa: E402
from ckptlab.worker.engine.run import run_experiment  # noqa: E402

BASE = {
    "model": {"kind": "mlp", "depth": 32, "width": 512, "dropout": 0.0},
    "batch_size": 64,
    "steps": 3,
    "timed_steps": 20,
    "device": "cpu",
    "optimizer": "adam",
    "verify_gradients": False,
}


def verdict(checkpoint: dict) -> dict[str, RatioInterval]:
    """The paired overhead of one run, as the product judges it (``product``: the summary's
    rounds, CPU time on CPU) and by the wall-time rounds of the same run (``wall``)."""
    s = RunSummary.load(run_experiment(ExperimentSpec.model_validate({**BASE, "checkpoint": checkpoint})).dump())
    product = s.paired_rounds()
    return {
        "product": paired_ratio_ci(product[0], product[1], threshold_pct=NOISE_THRESHOLD_PCT),
        "wall": paired_ratio_ci(s.paired_baseline_step_times_ms, s.step_times_ms, threshold_pct=NOISE_THRESHOLD_PCT),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--load", action="store_true", help="one spinning process per core throughout")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range((os.cpu_count() or 1) if args.load else 0)
    ]
    t0 = time.perf_counter()
    loads: list[float] = []
    same_ok = {"product": 0, "wall": 0}
    real_ok = {"product": 0, "wall": 0}
    real_est: dict[str, list[float]] = {"product": [], "wall": []}
    try:
        for _ in range(args.repeats):
            same = [verdict({"strategy": "sequential", "segments": 1}) for _ in range(3)]
            real = verdict({"strategy": "per_block"})
            for clock in ("product", "wall"):
                same_ok[clock] += all(not v[clock].measurable for v in same)
                real_ok[clock] += real[clock].measurable and real[clock].estimate_pct > 0
                real_est[clock].append(real[clock].estimate_pct)
            loads.append(os.getloadavg()[0])
    finally:
        for p in spinners:
            p.kill()
    n = args.repeats
    for clock in ("product", "wall"):
        est = real_est[clock]
        print(
            f"| {'CPU time (the product)' if clock == 'product' else 'wall time'} | {args.threads} "
            f"| {'yes' if args.load else 'no'} | {same_ok[clock]} of {n} | {real_ok[clock]} of {n} "
            f"| {statistics.median(est):+.0f}% [{min(est):+.0f}, {max(est):+.0f}] "
            f"| {min(loads):.1f}-{max(loads):.1f} |"
        )
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
