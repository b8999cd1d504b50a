"""Predicted against measured step-time overhead (issue 31): is ``plan.predicted_overhead``
within ±15% relative (or ±3 percentage points, whichever is larger) of the paired measured
overhead, for ``auto``, ``per_block`` and ``sequential 2`` on six models?

For each model (an MLP with dropout, the built-in transformer, a DenseNet, Hugging Face
GPT-2, Llama and ViT; sizes where an un-checkpointed step takes 100-250 ms on one thread)
the bench runs ``none`` (memory only: its peak), ``per_block`` (its peak), then ``auto`` at
a budget halfway between the two peaks, then ``per_block`` and ``sequential`` 2 again, each
with paired timing (20 rounds; CPU time on one thread, the product's defaults). The
predictions are the ``auto`` run's: ``plan.predicted_overhead`` for its own plan, and
``plan.alternatives`` for ``per_block`` and ``sequential 2`` of the same model (blocks and
step timed apart, without the tracker, in ``auto``'s profile:
:mod:`ckptlab.worker.engine.block_timing`). Measured: each run's stored paired overhead
(``paired_overhead``: the median of per-round ratios with its bootstrap 95% CI).

With ``--load`` (the default; ``--quiet`` turns it off) one spinning process per core runs
throughout (bench/load.py). ``--repeats N`` (default 3) runs the three plans N times in
rotating order: the table gives the median prediction, the median measured overhead and
its range over the rounds (a paired overhead's 95% CI covers the steps of one run, not
the run-to-run part of the noise: ckptlab.analysis.stats), whether the medians agree
within the tolerance and in how many rounds each run's pair did. Each run's own figures
follow as comments.

Usage: python bench/bench_overhead_prediction.py [--models mlp,gpt2] [--repeats N] [--quiet]
Prints a Markdown table and the time the ``auto`` runs spent timing.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from load import busy_loops  # noqa: E402

from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.worker.engine.run import run_experiment  # noqa: E402

BASE = {
    "steps": 2,
    "warmup_steps": 1,
    "timed_steps": 20,
    "device": "cpu",
    "optimizer": "adam",
    "seed": 0,
    "verify_gradients": False,
}
_HF = {"kind": "hf", "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4}
MODELS: dict[str, tuple[dict, int]] = {
    "mlp": ({"kind": "mlp", "depth": 8, "width": 256, "dropout": 0.1}, 2048),
    "transformer": (
        {"kind": "transformer", "depth": 4, "d_model": 128, "heads": 4, "seq_len": 256, "vocab_size": 1000},
        4,
    ),
    "densenet": ({"kind": "densenet", "depth": 4, "growth_rate": 16, "bn_size": 4, "image_size": 32}, 16),
    "gpt2": ({**_HF, "architecture": "gpt2", "seq_len": 256, "vocab_size": 1000}, 4),
    "llama": ({**_HF, "architecture": "llama", "intermediate_size": 512, "seq_len": 256, "vocab_size": 1000}, 4),
    "vit": ({**_HF, "architecture": "vit", "intermediate_size": 512, "patch_size": 8, "image_size": 96}, 16),
}
LABELS = {
    "mlp": "MLP 8×256, dropout 0.1, batch 2048",
    "transformer": "transformer 4×128, seq 256, batch 4",
    "densenet": "DenseNet 4 layers, growth 16, 32 px, batch 16",
    "gpt2": "hf gpt2 4×128, seq 256, batch 4",
    "llama": "hf llama 4×128, seq 256, batch 4",
    "vit": "hf vit 4×128, 96 px, patch 8, batch 16",
}
#: Issue 31's tolerance: ±15% of the measured overhead or ±3 percentage points, the larger.
RELATIVE, ABSOLUTE_PP = 0.15, 3.0


def spec(model: dict, batch: int, **checkpoint) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {**BASE, "model": model, "batch_size": batch, "checkpoint": {"strategy": "none", **checkpoint}}
    )


def within(predicted_pct: float, measured_pct: float) -> bool:
    """Issue 31's criterion: within ±15% relative or ±3 pp of the measured overhead."""
    return abs(predicted_pct - measured_pct) <= max(RELATIVE * abs(measured_pct), ABSOLUTE_PP)


def run_plans(model: dict, batch: int, budget: int, order: int) -> dict[str, tuple[float, float, str]]:
    """One round: ``auto`` at ``budget``, ``per_block`` and ``sequential`` 2 (rotated by
    ``order``), each paired; per plan, the prediction (%, from the ``auto`` run's plan and
    its ``alternatives``), the measured paired overhead (%) and the ``auto`` plan's blocks."""
    specs = {
        "auto": spec(model, batch, strategy="auto", budget_bytes=budget),
        "per_block": spec(model, batch, strategy="per_block"),
        "sequential 2": spec(model, batch, strategy="sequential", segments=2),
    }
    names = list(specs)
    names = names[order % 3 :] + names[: order % 3]
    summaries = {name: run_experiment(specs[name]).dump() for name in names}
    plan = summaries["auto"]["plan"]
    alternatives = {(a["strategy"], a.get("segments", a.get("every"))): a for a in plan["alternatives"]}
    predicted = {
        "auto": plan["predicted_overhead"],
        "per_block": alternatives["per_block", 1]["predicted_overhead"],
        "sequential 2": alternatives["sequential", 2]["predicted_overhead"],
    }
    out = {}
    for name, s in summaries.items():
        paired = s["paired_overhead"]
        out[name] = (100 * predicted[name]["estimate"], paired["estimate_pct"], str(plan["checkpointed_blocks"]))
        print(
            f"<!-- {name}: predicted {100 * predicted[name]['estimate']:+.1f}% "
            f"[{100 * predicted[name]['low']:+.1f}, {100 * predicted[name]['high']:+.1f}], measured "
            f"{paired['estimate_pct']:+.1f}% [{paired['low_pct']:+.1f}, {paired['high_pct']:+.1f}] -->",
            flush=True,
        )
    out["_timing"] = (plan["timing"]["elapsed_ms"], plan["profile_ms"], "")
    return out


def bench_model(name: str, repeats: int) -> tuple[list[str], list[float], list[float]]:
    """The table rows of one model, and the ``auto`` runs' timing and profile times (ms)."""
    model, batch = MODELS[name]
    quick = {"timed_steps": 0}
    none = run_experiment(spec(model, batch).model_copy(update=quick)).dump()["peak_allocated_bytes"]
    per_block = run_experiment(spec(model, batch, strategy="per_block").model_copy(update=quick)).dump()
    budget = (per_block["peak_allocated_bytes"] + none) // 2
    rounds = [run_plans(model, batch, budget, r) for r in range(repeats)]
    rows = []
    for plan in ("auto", "per_block", "sequential 2"):
        predicted = statistics.median(r[plan][0] for r in rounds)
        got = [r[plan][1] for r in rounds]
        middle = statistics.median(got)
        label = f"auto (blocks {', '.join(sorted({r[plan][2] for r in rounds}))})" if plan == "auto" else plan
        runs_within = sum(within(r[plan][0], r[plan][1]) for r in rounds)
        rows.append(
            f"| {LABELS[name]} | {label} | {predicted:+.1f}% | {middle:+.1f}% [{min(got):+.1f}, {max(got):+.1f}] "
            f"| {predicted - middle:+.1f} pp | {'yes' if within(predicted, middle) else '**no**'} "
            f"| {runs_within} of {len(rounds)} |"
        )
        print(rows[-1], flush=True)
    return rows, [r["_timing"][0] for r in rounds], [r["_timing"][1] for r in rounds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quiet", action="store_true", help="no busy loops")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(
        f"<!-- {platform.processor() or platform.machine()}, {cores} cores, torch {torch.__version__}, "
        f"{'no load' if args.quiet else f'{cores} busy loops'} -->"
    )
    print(
        "| model | plan | predicted | measured paired, median of rounds [min, max] | predicted − measured "
        "| within ±15% / ±3 pp? | rounds within |"
    )
    print("|---|---|---|---|---|---|---|", flush=True)
    t0 = time.perf_counter()
    costs = []
    with busy_loops(0 if args.quiet else cores):
        for name in args.models.split(","):
            _rows, timing_ms, profile_ms = bench_model(name, args.repeats)
            costs.append(
                f"{name} {statistics.median(timing_ms) / 1e3:.1f} s of {statistics.median(profile_ms) / 1e3:.1f} s"
            )
    print(f"\nauto's timing (of its whole profile): {'; '.join(costs)}")
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
