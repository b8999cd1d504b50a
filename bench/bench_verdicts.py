"""Benchmark: verdicts between runs under load (issue 31).

``--sweeps`` times (default 10), with ``--load`` busy loops beside it (default 2, one per
core of this 2-core VM), what a sweep with a repeated baseline runs: ``none``, ``per_block``
and ``none`` again (an MLP of 32 blocks of width 512, batch 64, 20 timed steps, the engine
in this process on one torch thread), judged as the sweep table judges them:

- the repeated baseline against the first (separate runs, identical work):
  :func:`ckptlab.analysis.stats.between_separate_runs` of their step times' interval; a
  verdict of "measurable" here is a false difference;
- per_block's overhead from its paired rounds (:func:`ckptlab.analysis.stats.paired_overhead_of`):
  a real recomputation cost (+31% to +35% on a quiet host), which should be found.

Targets: identical work never measurable; per_block measurable in >= 9 of 10.

Usage: python bench/bench_verdicts.py [--sweeps 10] [--load 2]. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import busy_loops  # noqa: E402

from ckptlab.analysis.stats import between_separate_runs, paired_overhead_of, ratio_ci  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.worker.engine.run import run_experiment  # noqa: E402

SPEC = {
    "model": {"kind": "mlp", "depth": 32, "width": 512},
    "batch_size": 64,
    "steps": 3,
    "timed_steps": 20,
    "verify_gradients": False,
    "device": "cpu",
}


def _run(strategy: str):
    return run_experiment(ExperimentSpec.model_validate({**SPEC, "checkpoint": {"strategy": strategy}}))


def _sweep() -> tuple[Any, Any]:
    """One sweep's two verdicts: the repeated baseline's drift and per_block's paired overhead."""
    first, per_block, again = _run("none"), _run("per_block"), _run("none")
    drift = between_separate_runs(
        ratio_ci(first.step_times_ms, again.step_times_ms), [again.host_load], [first.host_load]
    )
    return (drift, first, again), paired_overhead_of(per_block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=10)
    parser.add_argument("--load", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, busy loops: {args.load}\n")
    print("| sweep | repeated baseline (identical work) | CPU shares | per_block (paired) |")
    print("|---:|---|---|---|")
    false_alarms = found = 0
    with busy_loops(args.load):
        for i in range(1, args.sweeps + 1):
            (drift, first, again), paired = _sweep()
            false_alarms += drift.measurable
            found += paired.measurable
            verdict = "measurable" if drift.measurable else ("not comparable" if drift.not_comparable else "no diff.")
            shares = f"{first.host_load.cpu_share:.0%} / {again.host_load.cpu_share:.0%}"
            pb = f"{paired.estimate_pct:+.0f}% [{paired.low_pct:+.0f}, {paired.high_pct:+.0f}]"
            pb += " measurable" if paired.measurable else " not measurable"
            print(f"| {i} | {drift.estimate_pct:+.0f}%: {verdict} | {shares} | {pb} |", flush=True)
    n = args.sweeps
    print(f"\nidentical work called measurable: {false_alarms} of {n}; per_block found: {found} of {n}")


if __name__ == "__main__":
    main()
