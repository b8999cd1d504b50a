"""Instrumentation overhead: the engine's steps against a bare training step.

Both run the same model, strategy, data and optimizer in this process, alternating rounds
(bare, engine, bare, ...) so drift hits both alike, on CPU both on the timing pass's thread
count (``timing_cpu_threads``, default 1), the engine without paired timing (each
``on_step`` interval then holds one step of the run alone). "Bare" is a plain loop: forward, loss,
backward, optimizer step, no tracker, no per-phase timing or sync. The engine
(``ckptlab.worker.engine.run.run_experiment``) runs its memory pass (CPU: the live-tensor tracker;
CUDA: synchronised phases, allocator statistics, NVML) and then its timing pass (CPU:
tracker off); each step's time is taken between consecutive ``on_step`` callbacks, so it
includes everything the engine adds per step. The timing pass is what ckptlab reports as
step time; the memory pass is shown for comparison.

Usage: python bench/bench_overhead.py [--quick] [--device cpu|cuda] [--json]
Prints one line per configuration: median bare, timed-pass and memory-pass step time (ms),
and the timed pass's overhead over bare in % (median of the per-round ratios, with their
min-max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from ckptlab.settings import get_settings  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.worker.engine.run import run_experiment  # noqa: E402
from ckptlab.worker.engine.training import autocast_for, build_checkpointed, make_optimizer  # noqa: E402


def bare_steps(spec: ExperimentSpec, device: torch.device) -> list[float]:
    """Per-step wall times (ms) of a plain training loop for ``spec``, on CPU with the
    timing pass's thread count (setting ``timing_cpu_threads``), so both sides run alike."""
    threads = 0 if device.type == "cuda" else get_settings().timing_cpu_threads
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _bare_loop(spec, device)
    finally:
        torch.set_num_threads(before)


def _bare_loop(spec: ExperimentSpec, device: torch.device) -> list[float]:
    built = build_checkpointed(spec, device)
    params = list(built.module.parameters())
    opt = make_optimizer(spec, params)
    autocast = autocast_for(spec, device)
    gen = torch.Generator().manual_seed(spec.seed)
    times = []
    for _ in range(spec.steps):
        t0 = time.perf_counter()
        x, y = built.make_batch(spec.batch_size, gen)
        x, y = x.to(device), y.to(device)
        with autocast():
            out = built.module(x)
        loss = built.loss_fn(out, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times[spec.warmup_steps :]


def engine_steps(spec: ExperimentSpec, device: torch.device) -> tuple[list[float], list[float]]:
    """Per-step wall times (ms) of the engine between consecutive ``on_step`` calls: (memory
    pass after warm-up, timing pass)."""
    stamps: list[tuple[str, float]] = []
    run_experiment(
        spec, on_step=lambda rec: stamps.append((rec["extra"]["pass"], time.perf_counter())), device=str(device)
    ).dump()
    deltas = [(b[0], (b[1] - a[1]) * 1e3) for a, b in zip(stamps, stamps[1:], strict=False)]
    memory = [d for p, d in deltas if p == "memory"][max(spec.warmup_steps - 1, 0) :]
    timed = [d for p, d in deltas if p == "timed"][1:]  # the first also holds the pass switch
    return memory, timed


CONFIGS = {
    "mlp-72x1000-b256-seq8 (domain.md)": {
        "model": {"kind": "mlp", "depth": 72, "width": 1000},
        "batch_size": 256,
        "checkpoint": {"strategy": "sequential", "segments": 8},
    },
    "mlp-32x512-b64-none": {
        "model": {"kind": "mlp", "depth": 32, "width": 512},
        "batch_size": 64,
    },
    "transformer-4x256-seq128-per_block": {
        "model": {"kind": "transformer", "depth": 4, "d_model": 256, "heads": 4, "seq_len": 128, "vocab_size": 2000},
        "batch_size": 8,
        "checkpoint": {"strategy": "per_block"},
    },
}
QUICK = {"mlp-32x512-b64-none", "transformer-4x256-seq128-per_block"}


def measure(name: str, cfg: dict, device: torch.device, *, rounds: int, steps: int) -> dict:
    """Median bare, timed-pass and memory-pass step time (ms) of one configuration, and the
    timed pass's overhead over bare (median and range of the per-round ratios, %)."""
    spec = ExperimentSpec.model_validate(
        {
            **cfg,
            "steps": 4,
            "warmup_steps": 2,
            "timed_steps": steps + 1,
            "device": device.type,
            "verify_gradients": False,
            # one run's own instrumentation: paired timing would put the un-checkpointed
            # copy's step between two on_step calls (bench/bench_paired.py measures pairing)
            "paired_timing": False,
        }
    )
    bare_spec = spec.model_copy(update={"steps": steps + 2})
    bare, timed, memory, ratios = [], [], [], []
    for _ in range(rounds):
        b = bare_steps(bare_spec, device)
        m, t = engine_steps(spec, device)
        bare += b
        timed += t
        memory += m
        ratios.append(100 * (statistics.median(t) / statistics.median(b) - 1))
    b, t, m = statistics.median(bare), statistics.median(timed), statistics.median(memory)
    return {
        "config": name,
        "device": str(device),
        "bare_ms": round(b, 2),
        "timed_ms": round(t, 2),
        "memory_pass_ms": round(m, 2),
        "timed_overhead_pct": round(statistics.median(ratios), 1),
        "timed_overhead_min_pct": round(min(ratios), 1),
        "timed_overhead_max_pct": round(max(ratios), 1),
        "memory_pass_overhead_pct": round(100 * (m / b - 1), 1),
        "rounds": rounds,
        "samples": len(bare),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small models, few rounds (CI)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", action="store_true", help="print results as JSON lines")
    args = ap.parse_args()
    device = torch.device(args.device)
    rounds, steps = (2, 6) if args.quick else (7, 12)
    for name, cfg in CONFIGS.items():
        if args.quick and name not in QUICK:
            continue
        row = measure(name, cfg, device, rounds=rounds, steps=steps)
        line = (
            f"{name:40s} {device}  bare {row['bare_ms']:8.2f} ms  timed pass {row['timed_ms']:8.2f} ms "
            f"({row['timed_overhead_pct']:+.1f}%, rounds {row['timed_overhead_min_pct']:+.1f}..."
            f"{row['timed_overhead_max_pct']:+.1f}%)  memory pass {row['memory_pass_ms']:8.2f} ms "
            f"({row['memory_pass_overhead_pct']:+.1f}%)"
        )
        print(json.dumps(row) if args.json else line, flush=True)


if __name__ == "__main__":
    main()
