"""Instrumentation overhead: the engine's measured step against a bare training step.

Both run the same model, strategy, data and optimizer in this process, alternating rounds
(bare, instrumented, bare, ...) so drift hits both alike. "Bare" is a plain loop:
forward, loss, backward, optimizer step, no tracker, no per-phase timing or sync.
"Instrumented" is ``worker.engine.run_experiment`` (CPU: the live-tensor tracker; CUDA:
synchronised phases, allocator statistics, NVML); its step time is taken between
consecutive ``on_step`` callbacks so it includes everything the engine adds per step.

Usage: python bench/bench_overhead.py [--quick] [--device cpu|cuda] [--json]
Prints one line per configuration: median bare and instrumented step time (ms) and the
overhead in %.
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

from ckptlab.spec import ExperimentSpec  # noqa: E402
from worker.engine import _autocast, _build, _make_optimizer, run_experiment  # noqa: E402


def bare_steps(spec: ExperimentSpec, device: torch.device) -> list[float]:
    """Per-step wall times (ms) of a plain training loop for ``spec``."""
    built = _build(spec, device)
    params = list(built.module.parameters())
    opt = _make_optimizer(spec, params)
    autocast = _autocast(spec, device)
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


def instrumented_steps(spec: ExperimentSpec, device: torch.device) -> list[float]:
    """Per-step wall times (ms) of the engine, between consecutive ``on_step`` calls."""
    stamps: list[float] = []
    run_experiment(spec, on_step=lambda rec: stamps.append(time.perf_counter()), device=str(device))
    deltas = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:], strict=False)]
    return deltas[max(spec.warmup_steps - 1, 0) :]


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
    """Median bare and instrumented step time (ms) of one configuration, and the overhead %."""
    spec = ExperimentSpec.model_validate(
        {**cfg, "steps": steps, "warmup_steps": 2, "device": device.type, "verify_gradients": False}
    )
    bare, inst = [], []
    for _ in range(rounds):
        bare += bare_steps(spec, device)
        inst += instrumented_steps(spec, device)
    b, i = statistics.median(bare), statistics.median(inst)
    return {
        "config": name,
        "device": str(device),
        "bare_ms": round(b, 2),
        "instrumented_ms": round(i, 2),
        "overhead_pct": round(100 * (i - b) / b, 1),
        "samples": len(bare),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small models, few rounds (CI)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", action="store_true", help="print results as JSON lines")
    args = ap.parse_args()
    device = torch.device(args.device)
    rounds, steps = (2, 6) if args.quick else (4, 8)
    for name, cfg in CONFIGS.items():
        if args.quick and name not in QUICK:
            continue
        row = measure(name, cfg, device, rounds=rounds, steps=steps)
        line = (
            f"{name:40s} {device}  bare {row['bare_ms']:9.2f} ms  "
            f"instrumented {row['instrumented_ms']:9.2f} ms  overhead {row['overhead_pct']:+.1f}%"
        )
        print(json.dumps(row) if args.json else line, flush=True)


if __name__ == "__main__":
    main()
