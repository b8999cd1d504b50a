"""Strategy ``compile_budget`` (torch.compile with ``activation_memory_budget``) beside
``none``, ``per_block`` and ``auto``: peak, activation bytes, step time and compile time.

For each model (the bench_auto models) it runs ``none`` and ``per_block`` (eager), and
``compile_budget`` at 1.0 / 0.5 / 0.1 / 0.0. Memory: the eager runs are the exact tracker's,
the compiled ones the CPU allocator's (profiler memory events: the tracker cannot watch
compiled code; both agree to the byte on eager code, tests/worker/measure/test_allocator_probe.py).
Step times: each configuration runs once per round, in rotating order. An eager run's
overhead is paired (issue 19: each timed step beside a step of an un-checkpointed copy in
the same process; the median of the per-step CPU-time ratios); a compiled run's is its
median step CPU time over ``compile_budget`` 1.0's within the round (its own baseline: the
compiler's speed-up is not the budget's cost; the engine now pairs compiled runs with the
eager copy too, which this table does not read). The table gives
the median over rounds and the range.

Usage: python bench/bench_compile.py [--rounds N]
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptlab.analysis.explain import format_bytes  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.worker.engine.run import run_experiment  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_auto import BASE, MODELS, paired_overhead  # noqa: E402

BUDGETS = (1.0, 0.5, 0.1, 0.0)


def spec(model: dict, batch: int, **checkpoint) -> ExperimentSpec:
    """The bench spec without the gradient check (it would compile a second time)."""
    return ExperimentSpec.model_validate(
        {**BASE, "model": model, "batch_size": batch, "verify_gradients": False, "checkpoint": checkpoint}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        "| model | setting | peak | activations at end of forward | memory read from | step time vs its baseline "
        "(CPU time, median of rounds [min, max]) | compile (s, median) |"
    )
    print("|---|---|---:|---:|---|---|---:|")
    for name, (model, batch) in MODELS.items():
        variants = {"none": spec(model, batch, strategy="none"), "per_block": spec(model, batch, strategy="per_block")}
        for b in BUDGETS:
            variants[f"compile_budget {b}"] = spec(model, batch, strategy="compile_budget", activation_memory_budget=b)
        order = list(variants)
        summaries: dict[str, dict] = {}
        peaks: dict[str, list[int]] = {k: [] for k in order}
        ratios: dict[str, list[float]] = {k: [] for k in order}
        compile_s: dict[str, list[float]] = {k: [] for k in order}
        for r in range(args.rounds):
            turn = order[r % len(order) :] + order[: r % len(order)]
            times = {}
            for k in turn:
                s = run_experiment(variants[k]).dump()
                summaries[k] = s
                peaks[k].append(s["peak_allocated_bytes"])
                times[k] = statistics.median(s.get("step_cpu_ms") or [s["step_time_ms"]])
                if s.get("compile_ms") is not None:
                    compile_s[k].append(s["compile_ms"] / 1e3)
                if k == "per_block":
                    ratios[k].append(paired_overhead(s))
            for k in order:
                if k.startswith("compile_budget") and k != "compile_budget 1.0":
                    ratios[k].append(times[k] / times["compile_budget 1.0"] - 1)
        for k in order:
            s, v = summaries[k], ratios[k]
            against = "—" if not v else "compile 1.0" if k.startswith("compile") else "none"
            rel = (
                f"{100 * statistics.median(v):+.0f}% [{100 * min(v):+.0f}, {100 * max(v):+.0f}] vs {against}"
                if v
                else "— (baseline)"
            )
            comp = f"{statistics.median(compile_s[k]):.1f}" if compile_s[k] else "—"
            # The median round's peak; rounds that read otherwise are shown (the allocator
            # probe has read impossible peaks, 0 B, in a loaded run: issue 21's note).
            peak = int(statistics.median(peaks[k]))
            odd = sorted({p for p in peaks[k] if p != peak})
            shown = format_bytes(peak) + (f" (other rounds: {', '.join(format_bytes(p) for p in odd)})" if odd else "")
            print(
                f"| {name} | {k} | {shown} | {format_bytes(s['activation_bytes'])} "
                f"| {s.get('memory_source')} | {rel} | {comp} |",
                flush=True,
            )


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"\n{time.perf_counter() - t0:.0f} s")
