"""Is ``auto`` on the measured front (issue 31, Done-when #2)? On the built-in transformer (4
layers, d 128, seq 256, batch 4), for 4 budgets between ``per_block``'s and ``none``'s
measured peaks: ``auto``'s measured point (peak, paired overhead) against every measured
alternative that fits the budget.

Alternatives: ``sequential`` 2..4, ``per_block``, ``selective`` (every 1) under
``save_matmuls_and_attention`` and ``save_matmuls``, ``compile_budget`` 1.0 / 0.8 / 0.5 /
0.1, each with the blocks compiled (the strategy's default, the issue's alternatives) and with
the whole forward and loss compiled (``compile_scope`` ``step``, ``... step`` in the tables).
Every overhead is paired (each timed step beside a step of an eager un-checkpointed
copy in the same process; median of per-step CPU-time ratios, bootstrap 95% CI), the
compiled runs' too (the engine pairs them with the eager copy), so every point stands on
one footing.
Memory: exact on eager runs (the live-tensor tracker); the compiled runs' peaks are the
CPU allocator's (profiler memory events). ``auto`` runs twice per budget: eager only, and
with ``checkpoint.search_compile`` (``auto+compile``).

Per budget the table gives ``auto``'s plan, measured peak (≤ budget?), paired overhead with
its CI and predicted overhead, the best alternative that fits (the lowest overhead), whether
``auto`` is no worse than every fitting alternative within the CIs (``auto``'s estimate at
most the alternative's CI high end), and which
alternatives ``auto`` strictly dominates (a peak no higher and an overhead CI wholly
below the other's estimate; or a peak lower to the byte at an estimate no worse than the
other's CI high end). Each configuration runs once per round (``--rounds``, default
1), the medians over rounds are shown; every run's own figures follow as comments.

On CUDA (``--device cuda``) the peaks are the caching allocator's peak allocated bytes and
every overhead is paired on wall time after ``torch.cuda.synchronize`` (the engine's clock
there); ``--save`` is rewritten after every run, so a run stopped by a time limit leaves what
it measured.

Usage: python bench/bench_auto_front.py [--rounds N] [--timed-steps N] [--no-compile] [--device cpu|cuda] [--save F]
Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from ckptlab.analysis.explain import format_bytes  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.worker.engine.run import run_experiment  # noqa: E402

MODEL = {"kind": "transformer", "depth": 4, "d_model": 128, "heads": 4, "seq_len": 256, "vocab_size": 1000}
BATCH = 4
FRACTIONS = (0.2, 0.4, 0.6, 0.8)
COMPILE_BUDGETS = (1.0, 0.8, 0.5, 0.1)
POLICIES = ("save_matmuls_and_attention", "save_matmuls")


#: The device every spec runs on (``--device``).
DEVICE = ["cpu"]


def spec(timed_steps: int, **checkpoint) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "model": MODEL,
            "batch_size": BATCH,
            "steps": 2,
            "warmup_steps": 1,
            "timed_steps": timed_steps,
            "device": DEVICE[0],
            "optimizer": "adam",
            "seed": 0,
            "verify_gradients": False,
            "checkpoint": {"strategy": "none", **checkpoint},
        }
    )


def alternatives(timed_steps: int, with_compile: bool) -> dict[str, ExperimentSpec]:
    out = {f"sequential {k}": spec(timed_steps, strategy="sequential", segments=k) for k in range(2, 5)}
    out["per_block"] = spec(timed_steps, strategy="per_block")
    for policy in POLICIES:
        out[f"selective {policy}"] = spec(timed_steps, strategy="selective", policy=policy, every=1)
    if with_compile:
        for b in COMPILE_BUDGETS:
            out[f"compile_budget {b}"] = spec(timed_steps, strategy="compile_budget", activation_memory_budget=b)
        for b in COMPILE_BUDGETS:  # the whole forward and loss compiled (what auto+compile also searches)
            out[f"compile_budget {b} step"] = spec(
                timed_steps, strategy="compile_budget", activation_memory_budget=b, compile_scope="step"
            )
    return out


def figures(s: dict) -> dict:
    """A run's peak (bytes), paired overhead (fractions, or None) and median step CPU time (ms)."""
    paired = s.get("paired_overhead")
    return {
        "peak": s["peak_allocated_bytes"],
        "overhead": None if paired is None else tuple(paired[k] / 100 for k in ("estimate_pct", "low_pct", "high_pct")),
        "cpu_ms": statistics.median(s.get("step_cpu_ms") or [s["step_time_ms"]]),
    }


def one_round(specs: dict[str, ExperimentSpec], order: int, save=lambda out: None) -> dict[str, dict]:
    """Every spec once, starting at ``order`` (rotated); ``save(out)`` after each run."""
    names = list(specs)
    names = names[order % len(names) :] + names[: order % len(names)]
    out: dict[str, dict] = {}
    for name in names:
        t0 = time.perf_counter()
        s = run_experiment(specs[name]).dump()
        f = figures(s)
        if name.startswith("auto"):
            plan = s["plan"]
            f["plan"] = plan["segments"]
            if plan.get("chosen") == "compile_budget":
                c = plan["compiled"]
                f["plan"] = [["compile", c["activation_memory_budget"], c.get("compile_scope") or "blocks"]]
            f["predicted_peak"] = s["predicted_peak_bytes"]
            f["predicted_overhead"] = plan["predicted_overhead"]["estimate"] if plan["predicted_overhead"] else None
            f["alternatives"] = {
                a["name"]: a["predicted_overhead"]["estimate"] for a in plan["alternatives"] if a["predicted_overhead"]
            }
        out[name] = f
        save(out)
        o = f["overhead"]
        words = f"{100 * o[0]:+.1f}% [{100 * o[1]:+.1f}, {100 * o[2]:+.1f}]" if o else f"{f['cpu_ms']:.1f} ms CPU/step"
        extra = f" plan {f['plan']} predicted {f['predicted_peak']}" if "plan" in f else ""
        print(f"<!-- {name}: peak {f['peak']} B, {words}{extra} ({time.perf_counter() - t0:.0f} s) -->", flush=True)
    return out


def key_of(name: str) -> str:
    """An alternative's name in ``plan.alternatives`` (the strategy table's label)."""
    if name.startswith("sequential"):
        return f"sequential ({name.split()[1]})"
    if name.startswith("selective"):
        return f"selective ({name.split()[1]}, every 1)"
    return f"{name} (every 1)"


def predicted_for(rounds: list[dict[str, dict]], name: str) -> float | None:
    """The median over every ``auto`` run of its profile's predicted overhead for ``name``."""
    got = [f["alternatives"].get(key_of(name)) for r in rounds for n, f in r.items() if n.startswith("auto")]
    got = [g for g in got if g is not None]
    return statistics.median(got) if got else None


def median_point(rounds: list[dict[str, dict]], name: str) -> dict:
    """Over rounds: the median peak and the median of each overhead figure."""
    runs = [r[name] for r in rounds]
    point = {"peak": int(statistics.median(f["peak"] for f in runs)), "peaks": [f["peak"] for f in runs]}
    if all(f["overhead"] is not None for f in runs):
        point["overhead"] = tuple(statistics.median(f["overhead"][k] for f in runs) for k in range(3))
    else:
        point["overhead"] = None
    for key in ("plan", "predicted_peak", "predicted_overhead"):
        if key in runs[0]:
            point[key] = (
                runs[0][key] if key == "plan" else statistics.median(f[key] for f in runs if f[key] is not None)
            )
    point["plans"] = {plan_words(f["plan"]) for f in runs if "plan" in f}
    return point


def pct(o: tuple | None, ci: bool = True) -> str:
    if o is None:
        return "—"
    if not ci or o[1] == o[2] == o[0]:
        return f"{100 * o[0]:+.1f}%"
    return f"{100 * o[0]:+.1f}% [{100 * o[1]:+.1f}, {100 * o[2]:+.1f}]"


def plan_words(segments: list) -> str:
    if segments and segments[0][0] == "compile":
        scope = segments[0][2] if len(segments[0]) > 2 else "blocks"
        return f"compile_budget {segments[0][1]}" + (" step" if scope == "step" else "")
    parts = []
    for seg in segments:
        start, end, ckpt = seg[:3]
        blocks = f"{start}" if end - start == 1 else f"{start}-{end - 1}"
        parts.append(f"{blocks} {seg[3] if len(seg) > 3 else 'recompute' if ckpt else 'keep'}")
    return ", ".join(parts)


def fits_words(peaks: list[int], budget: int) -> str:
    """ "yes" when every run's peak is at or under ``budget``, else how many were over and by
    how much (a median under the budget must not hide a run above it)."""
    over = [p - budget for p in peaks if p > budget]
    if not over:
        return "yes"
    return f"**no** in {len(over)} of {len(peaks)} runs, up to {max(over):,} B over"


def budget_row(points: dict[str, dict], b: int, kind: str) -> str:
    """One ``auto`` point against every alternative (Markdown row). "No worse": its estimate
    at most each fitting alternative's CI high end. Dominates, measurably faster: a peak no
    higher and its CI wholly below the other's estimate. Dominates, lower peak: a peak
    lower to the byte (peaks are exact) and an estimate no worse (at most the other's CI
    high end): strict Pareto dominance with "no worse" read through the noise."""
    a = points[f"{kind} {b}"]
    others = {n: p for n, p in points.items() if not n.startswith("auto") and p["overhead"]}
    fitting = {n: p for n, p in others.items() if p["peak"] <= b}
    best = min(fitting, key=lambda n: fitting[n]["overhead"][0]) if fitting else None
    ao = a["overhead"]
    worse = [n for n, p in fitting.items() if ao is not None and ao[0] > p["overhead"][2]]
    faster = [n for n, p in others.items() if ao and a["peak"] <= p["peak"] and ao[2] < p["overhead"][0]]
    lower = [n for n, p in others.items() if ao and a["peak"] < p["peak"] and ao[0] <= p["overhead"][2]]
    predicted = a.get("predicted_overhead")
    best_words = f"{best} {pct(fitting[best]['overhead'])}" if best else "none fits"
    return (
        f"| {format_bytes(b)} | {kind} | {'; '.join(sorted(a['plans']))} "
        f"| {format_bytes(a['peak'])} ({fits_words(a['peaks'], b)}) "
        f"| {pct(ao)} | {f'{100 * predicted:+.1f}%' if predicted is not None else '—'} | {best_words} "
        f"| {'yes' if not worse else '**no**: ' + ', '.join(worse)} | {', '.join(faster) or '—'} "
        f"| {', '.join(lower) or '—'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timed-steps", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--save", help="write every round's figures here (JSON; rewritten after every run)")
    args = parser.parse_args()
    DEVICE[0] = args.device
    t0 = time.perf_counter()
    print(
        f"<!-- {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"device {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, "
        f"{args.rounds} round(s), {args.timed_steps} timed steps -->",
        flush=True,
    )
    quick = spec(0)
    none = run_experiment(quick).dump()["peak_allocated_bytes"]
    per_block = run_experiment(quick.model_copy(update={"checkpoint": spec(0, strategy="per_block").checkpoint}))
    low = per_block.dump()["peak_allocated_bytes"]
    budgets = [int(low + (none - low) * f) for f in FRACTIONS]
    print(f"<!-- none {none} B, per_block {low} B, budgets {budgets} -->", flush=True)
    specs = alternatives(args.timed_steps, not args.no_compile)
    for b in budgets:
        specs[f"auto {b}"] = spec(args.timed_steps, strategy="auto", budget_bytes=b)
        if not args.no_compile:
            specs[f"auto+compile {b}"] = spec(args.timed_steps, strategy="auto", budget_bytes=b, search_compile=True)
    rounds: list[dict[str, dict]] = []

    def save(current: dict[str, dict]) -> None:
        if args.save:
            Path(args.save).write_text(json.dumps([*rounds, current], default=str))

    for r in range(args.rounds):
        rounds.append(one_round(specs, r, save))
    points = {name: median_point(rounds, name) for name in specs}

    print(
        "\n| alternative | peak | overhead, paired with the eager un-checkpointed step [95% CI] "
        "| predicted by auto's profile (median of its runs) |"
    )
    print("|---|---:|---|---|")
    for name, p in points.items():
        if not name.startswith("auto"):
            predicted = None if name.startswith("compile") else predicted_for(rounds, name)
            words = f"{100 * predicted:+.1f}%" if predicted is not None else "—"
            print(f"| {name} | {format_bytes(p['peak'])} | {pct(p['overhead'])} | {words} |")

    print(
        "\n| budget | auto | auto's plan | auto peak (fits?) | auto overhead, paired [95% CI] | predicted "
        "| best fitting alternative | no worse than every fitting one? | dominates, measurably faster "
        "| dominates, lower peak |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b in budgets:
        for kind in ("auto", "auto+compile"):
            if f"{kind} {b}" in points:
                print(budget_row(points, b, kind), flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
