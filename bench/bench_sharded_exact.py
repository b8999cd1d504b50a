"""Sharded predictions against measured CPU ranks: is the traced rank the measured rank?

For the MLP (4 x 64) under none, the built-in transformer and a small hf llama under
per_block (FSDP2, world size 2, batch 4 per rank, the specs of ``tests.factories.sharded_spec``),
one prediction on the ``cpu`` target (one rank traced over a fake process group) and
``--repeats`` real runs (two gloo processes), each rank's measured peak minus the predicted
peak, in bytes. ``--load N`` runs N busy loops beside it (a loaded host: the measured ranks
then wait on gloo's threads the most). Target (issue 30): within 2% on every run.

Usage: python bench/bench_sharded_exact.py [--repeats 4] [--load 2]. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import busy_loops  # noqa: E402

from ckptlab.prediction.targets import CPU_TARGET  # noqa: E402
from ckptlab.worker.distributed import run_distributed  # noqa: E402
from ckptlab.worker.predict import predict_run  # noqa: E402
from tests.factories import sharded_spec  # noqa: E402

CASES = [("mlp", "none"), ("transformer", "per_block"), ("hf-llama", "per_block")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--load", type=int, default=0, help="busy loops beside the runs")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, busy loops: {args.load}\n")
    print("| model | strategy | predicted peak (B) | measured − predicted per rank (B), each run | worst |")
    print("|---|---|---:|---|---:|")
    with busy_loops(args.load):
        for model, strategy in CASES:
            spec = sharded_spec(model, strategy).model_copy(update={"verify_gradients": False})
            predicted = predict_run(spec, CPU_TARGET).peak_allocated_bytes
            diffs = [
                [r.peak_allocated_bytes - predicted for r in run_distributed(spec).ranks] for _ in range(args.repeats)
            ]
            worst = max(abs(d) for run in diffs for d in run) / predicted
            cells = " ".join(str(run) for run in diffs)
            print(f"| {model} | {strategy} | {predicted:,} | {cells} | {worst:.2%} |", flush=True)


if __name__ == "__main__":
    main()
