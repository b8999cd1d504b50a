"""Real architectures through `ckptlab run`: a GPT-2-small-sized ``hf`` gpt2 (12 layers,
768 hidden, 12 heads, sequence 512, batch 2) and a ResNet-50-sized ``hf`` resnet (image 224,
batch 8), each under ``none``, ``per_block``, ``sequential`` 2 and 4 and ``selective``.

Each configuration is one ``ckptlab run SPEC.json --json`` process (the product's own path,
from spec to stored summary). Every strategy runs once per round, in rotating order (A B C,
B C A, ...), so a load burst hits each alike; the overhead against ``none`` is taken per
round (the ratio of the two runs' median step times) and reported as the median over
rounds with its min and max. Memory figures are exact byte counts (CPU: the live-tensor
tracker), the same in every round.

Usage: python bench/bench_hf.py [--quick] [--rounds N] [--out DIR]
Prints one Markdown table row per configuration; the spec files stay in DIR (default a
temporary directory) so each row can be re-run by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODELS = {
    "GPT-2 small (hf gpt2, 12×768, seq 512, batch 2)": (
        {
            "kind": "hf",
            "architecture": "gpt2",
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "vocab_size": 50257,
            "seq_len": 512,
        },
        2,
    ),
    "ResNet-50 (hf resnet, 224 px, batch 8)": ({"kind": "hf", "architecture": "resnet", "image_size": 224}, 8),
}
STRATEGIES = {
    "none": {"strategy": "none"},
    "per_block": {"strategy": "per_block", "every": 1},
    "sequential 2": {"strategy": "sequential", "segments": 2},
    "sequential 4": {"strategy": "sequential", "segments": 4},
    "selective": {"strategy": "selective", "policy": "save_matmuls", "every": 1},
}
QUICK_MODELS = {
    "tiny gpt2": (
        {
            "kind": "hf",
            "architecture": "gpt2",
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "vocab_size": 1000,
            "seq_len": 64,
        },
        2,
    ),
}


def run(spec_path: Path, data_dir: Path) -> dict:
    """``ckptlab run SPEC --json`` in a child process; its summary (the last line)."""
    env = {**os.environ, "CKPTLAB_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "ckptlab.cli", "run", str(spec_path), "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{spec_path}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mib(n: int | None) -> str:
    return "–" if n is None else f"{n / 2**20:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny gpt2 only (seconds)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every strategy, in rotating order")
    parser.add_argument("--out", type=Path, default=None, help="directory for the spec files and the database")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_hf_"))
    out.mkdir(parents=True, exist_ok=True)
    models = QUICK_MODELS if args.quick else MODELS
    print(f"# {os.cpu_count()} CPUs, `ckptlab run` per configuration, {args.rounds} rounds; specs in {out}")
    print(
        "| model | strategy | peak allocated (MiB) | activations at end of forward (MiB) "
        "| step (ms, median of rounds) | vs none (median of per-round ratios, [min, max]) | load avg |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    names = list(STRATEGIES)
    for label, (model, batch) in models.items():
        results: dict[str, list[dict]] = {n: [] for n in names}
        loads: list[float] = []
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # A B C, B C A, ...
                spec = {
                    "model": model,
                    "batch_size": batch,
                    "steps": 2,
                    "warmup_steps": 1,
                    "timed_steps": 5,
                    "device": "cpu",
                    "verify_gradients": False,
                    "checkpoint": STRATEGIES[name],
                }
                path = out / f"{model['architecture']}_{name.replace(' ', '')}.json"
                path.write_text(json.dumps(spec, indent=1))
                loads.append(os.getloadavg()[0])
                results[name].append(run(path, out / "data"))
        base = [s["timing"]["step_ms"]["median"] for s in results["none"]]
        for name in names:
            runs = results[name]
            times = [s["timing"]["step_ms"]["median"] for s in runs]
            ratios = [t / b - 1 for t, b in zip(times, base, strict=True)]
            vs = "–" if name == "none" else f"{statistics.median(ratios):+.0%} [{min(ratios):+.0%}, {max(ratios):+.0%}]"
            first = runs[0]
            print(
                f"| {label} | {name} | {mib(first['peak_allocated_bytes'])} | {mib(first['activation_bytes'])} "
                f"| {statistics.median(times):,.0f} | {vs} | {min(loads):.1f}–{max(loads):.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
