"""Strategy ``auto`` against a memory budget: does the plan fit, how close is its predicted
peak, and what does it recompute against the best uniform ``sequential`` split that fits?

For each model (an MLP, the built-in transformer, the ResNet-style generator) the bench
finds the peak without checkpointing and the smallest peak ``auto`` can reach, then runs
``auto`` at 6 budgets from just above the smallest to above the un-checkpointed peak. For
each budget it also runs every ``sequential`` split and ``per_block`` and keeps those whose
measured peak fits. Memory is exact (CPU: the live-tensor tracker), the same in every
round. Step times: every run is timed paired (issue 19: each timed step beside a step of an
un-checkpointed copy in the same process, rotating order), so its overhead against ``none``
is the median of its per-step CPU-time ratios, a load burst cancelling in each ratio; each
configuration runs once per round and the table gives the median over rounds and the range
(the machine is shared: differences inside the spread are noise).

Usage: python bench/bench_auto.py [--rounds N] [--quick]
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptlab.analysis.explain import format_bytes  # noqa: E402
from ckptlab.analysis.stats import paired_ratio_ci  # noqa: E402
from ckptlab.planning.planner import BlockProfile, pooled_forward_times, recompute_ms, sequential_segments  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.summary import RunSummary  # noqa: E402
from ckptlab.worker.engine.run import run_experiment  # noqa: E402
from ckptlab.worker.errors import RunError  # noqa: E402

BASE = {"steps": 3, "warmup_steps": 1, "timed_steps": 10, "device": "cpu", "optimizer": "adam", "seed": 0}
MODELS = {
    "MLP 16×256, batch 512": ({"kind": "mlp", "depth": 16, "width": 256}, 512),
    "transformer 8×128, seq 128, batch 8": (
        {"kind": "transformer", "depth": 8, "d_model": 128, "heads": 4, "seq_len": 128, "vocab_size": 1000},
        8,
    ),
    "ResNet generator 8 blocks, 8 ch, 32 px, batch 8": (
        {"kind": "resnet", "depth": 8, "channels": 8, "image_size": 32},
        8,
    ),
}


def spec(model: dict, batch: int, **checkpoint) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {**BASE, "model": model, "batch_size": batch, "checkpoint": {"strategy": "none", **checkpoint}}
    )


def smallest_peak(model: dict, batch: int) -> int:
    """The smallest peak auto can plan for (its refusal of a budget just above the fixed memory says it)."""
    try:
        run_experiment(spec(model, batch, strategy="auto", budget_bytes=1)).dump()
    except RunError as below_fixed:
        fixed = below_fixed.details["fixed_bytes"]
    try:
        run_experiment(spec(model, batch, strategy="auto", budget_bytes=fixed + 1)).dump()
    except RunError as below:
        return below.details["smallest_reachable_peak_bytes"]
    return fixed + 1


def paired_overhead(result: dict) -> float:
    """A run's overhead over its paired un-checkpointed copy, as a fraction (0.12 = +12%)."""
    rounds = RunSummary.model_validate(result).paired_rounds()
    if rounds is None:
        raise SystemExit(f"run not paired: {result.get('pairing_skipped')}")
    return paired_ratio_ci(rounds[0], rounds[1]).estimate_pct / 100


def pct(ratios: dict[str, list[float]], key: str) -> str:
    """Median overhead over rounds and its range, e.g. ``+12% [+8, +15]``."""
    values = ratios.get(key)
    if not values:
        return "—"
    return f"{100 * statistics.median(values):+.0f}% [{100 * min(values):+.0f}, {100 * max(values):+.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 budgets per model, 1 round")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    print(
        "| model | budget | auto: predicted / measured peak (error) | fits | auto recomputes (blocks) "
        "| best uniform sequential that fits | per_block peak | step time vs none: auto / best sequential "
        "/ per_block (paired CPU time, median of rounds [min, max]) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, (model, batch) in MODELS.items():
        none = run_experiment(spec(model, batch)).dump()
        top, low = none["peak_allocated_bytes"], smallest_peak(model, batch)
        fractions = (0.0, 1.0) if args.quick else (0.0, 0.2, 0.4, 0.6, 0.8, 1.2)
        depth = model["depth"]
        uniform = {
            k: run_experiment(spec(model, batch, strategy="sequential", segments=k)).dump() for k in range(1, depth + 1)
        }
        per_block = run_experiment(spec(model, batch, strategy="per_block")).dump()
        for f in fractions:
            budget = int(low + (top - low) * f) + 1
            plan = run_experiment(spec(model, batch, strategy="auto", budget_bytes=budget)).dump()
            # The uniform splits' recomputation from the same profile, timed as auto's planner
            # times it (identical blocks at their median forward time).
            blocks = pooled_forward_times([BlockProfile(**b) for b in plan["plan"]["blocks"]])
            fits = {
                k: recompute_ms(blocks, sequential_segments(depth, k))
                for k, s in uniform.items()
                if s["peak_allocated_bytes"] <= budget
            }
            best_k = min(fits, key=fits.get) if fits else None
            variants = {"auto": spec(model, batch, strategy="auto", budget_bytes=budget)}
            if best_k is not None:
                variants["sequential"] = spec(model, batch, strategy="sequential", segments=best_k)
            variants["per_block"] = spec(model, batch, strategy="per_block")
            ratios: dict[str, list[float]] = {k: [] for k in variants}
            order = list(variants)
            for r in range(rounds):
                for k in order[r % len(order) :] + order[: r % len(order)]:
                    ratios[k].append(paired_overhead(run_experiment(variants[k]).dump()))

            predicted, measured = plan["predicted_peak_bytes"], plan["peak_allocated_bytes"]
            ckpt = plan["plan"]["checkpointed_blocks"]
            print(
                f"| {name} | {format_bytes(budget)} | {format_bytes(predicted)} / {format_bytes(measured)} "
                f"({100 * (predicted - measured) / measured:+.1f}%) | {'yes' if measured <= budget else '**no**'} "
                f"| {plan['plan']['recompute_ms']:.1f} ms ({len(ckpt)} of {depth}) "
                f"| {f'segments={best_k}, {fits[best_k]:.1f} ms' if best_k else 'none fits'} "
                f"| {format_bytes(per_block['peak_allocated_bytes'])} "
                f"| {pct(ratios, 'auto')} / {pct(ratios, 'sequential')} / {pct(ratios, 'per_block')} |",
                flush=True,
            )
        print(f"<!-- {name}: none {format_bytes(top)}, smallest auto {format_bytes(low)} -->", flush=True)


if __name__ == "__main__":
    main()
