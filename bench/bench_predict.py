"""Predictions ("will it fit?"): Llama-3-8B on an H100 80GB, without allocating it.

The spec is Llama-3-8B (hf llama: hidden 4096, 32 layers, 32 heads, 8 key-value heads,
intermediate 14336, vocabulary 128256), sequence 8192, batch 1, bf16 autocast, AdamW. Each
configuration is predicted in a fresh child process (``python -m ckptlab.worker.predict``,
the entry the API runs), so that its wall time includes importing torch and transformers
and its peak RSS (the child's ``resource.getrusage(RUSAGE_SELF).ru_maxrss``) is its own.

1. ``h100-80gb`` for strategies ``none``, ``per_block`` and ``auto`` (auto's budget: the
   target's default, ``ckptlab.worker.predict.default_budget_bytes``): wall time, peak RSS,
   the verdict and its figures. Targets: each <= 60 s and <= 4 GiB RSS.
2. ``per_block`` on every target of the table.
3. With ``--sharded``: FSDP2 (``fully_shard`` per block, then the root; one rank traced over
   a fake process group) at world sizes 8 and 64, ``per_block`` and ``none`` on
   ``h100-80gb``, for Llama-3-8B and Llama-2-70B (hidden 8192, 80 layers, 64 heads, 8
   key-value heads, intermediate 28672, vocabulary 32000, sequence 4096): per-rank figures,
   wall time and peak RSS. Target: each <= 120 s.

Usage: python bench/bench_predict.py [--quick] [--sharded] (``--quick``: 2 layers).
Prints Markdown tables. CUDA figures are modelled and unverified (no GPU measured them).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptlab.analysis.explain import format_bytes  # noqa: E402
from ckptlab.domain import Status  # noqa: E402
from ckptlab.prediction.targets import target_names  # noqa: E402

LLAMA3_8B = {
    "kind": "hf",
    "architecture": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "seq_len": 8192,
}
LLAMA2_70B = {
    **LLAMA3_8B,
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "intermediate_size": 28672,
    "vocab_size": 32000,
    "seq_len": 4096,
}
BASE = {"batch_size": 1, "steps": 3, "warmup_steps": 1, "amp": "bf16", "optimizer": "adamw", "seed": 0}


def request(
    strategy: str, targets: list[str], layers: int, base: dict[str, Any] = LLAMA3_8B, world_size: int = 1
) -> dict[str, Any]:
    """The JSON request ``python -m ckptlab.worker.predict`` reads (auto without a budget:
    each target's default); ``world_size`` above 1: FSDP2 over that many ranks."""
    spec = {**BASE, "model": {**base, "num_hidden_layers": layers}, "checkpoint": {"strategy": strategy}}
    if world_size > 1:
        spec["distributed"] = {"kind": "fsdp2", "world_size": world_size}
    return {"spec": spec, "targets": targets}


#: The child: the entry's main(), then its own peak RSS on stderr's last line.
CHILD = (
    "import resource, sys\n"
    "from ckptlab.worker.predict.__main__ import main\n"
    "rc = main()\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def predict(body: dict[str, Any]) -> tuple[list[dict[str, Any]], float, int]:
    """One child process: its answer lines, wall time (s) and peak RSS (bytes, Linux's
    ``ru_maxrss`` is in KiB)."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD], input=json.dumps(body), capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"the predict entry failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    rss = int(out.stderr.strip().splitlines()[-1])
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()], wall, rss


def row(answer: dict[str, Any]) -> dict[str, str]:
    """The figures of one answer, formatted."""
    if answer["status"] != Status.SUCCEEDED:
        return {"verdict": f"refused: {answer['error']}"}
    s = answer["summary"]
    p = s["prediction"]
    plan = s.get("plan") or {}
    return {
        "peak allocated": format_bytes(s.get("peak_allocated_bytes")),
        "peak phase": str(s.get("peak_phase")),
        "activations": format_bytes(s.get("activation_bytes")),
        "reserved": format_bytes(p.get("peak_reserved_bytes")),
        "device used": format_bytes(p.get("device_used_bytes")),
        "capacity": format_bytes(p.get("capacity_bytes")),
        "fits": str(p.get("fits")),
        "fixed": format_bytes(p.get("fixed_bytes")),
        "sdpa": str(p.get("sdpa_backend")),
        "checkpointed": str(len(plan.get("checkpointed_blocks", []))) if plan else "",
        "verdict": next((n for n in p["notes"] if n.startswith("does not fit")), ""),
    }


def table(rows: list[dict[str, str]]) -> str:
    """A Markdown table of ``rows`` (the union of their keys, in order)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(r.get(k, "") for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 layers instead of 32")
    parser.add_argument("--sharded", action="store_true", help="only FSDP2 at world sizes 8 and 64")
    args = parser.parse_args()
    if args.sharded:
        sharded(args.quick)
        return
    layers = 2 if args.quick else LLAMA3_8B["num_hidden_layers"]
    print(f"machine: {platform.processor() or platform.machine()}, {platform.python_version()}, layers {layers}\n")
    rows = []
    for strategy in ("none", "per_block", "auto"):
        answers, wall, rss = predict(request(strategy, ["h100-80gb"], layers))
        rss_text = format_bytes(rss)
        rows.append({"strategy": strategy, "wall": f"{wall:.1f} s", "peak RSS": rss_text, **row(answers[0])})
        print(f"{strategy}: {wall:.1f} s, {rss_text}", file=sys.stderr)
    print("Llama-3-8B on h100-80gb (CUDA figures modelled, unverified):\n")
    print(table(rows))
    answers, wall, rss = predict(request("per_block", target_names(), layers))
    print(f"\nper_block on every target (one child, {wall:.1f} s):\n")
    print(table([{"target": a["target"], **row(a)} for a in answers]))


def sharded(quick: bool) -> None:
    """Part 3 of the module docstring: one child per configuration."""
    print(f"machine: {platform.processor() or platform.machine()}, {platform.python_version()}\n")
    rows = []
    for name, base in (("Llama-3-8B s8192", LLAMA3_8B), ("Llama-2-70B s4096", LLAMA2_70B)):
        layers = 2 if quick else base["num_hidden_layers"]
        for world in (8, 64):
            for strategy in ("per_block", "none"):
                answers, wall, rss = predict(request(strategy, ["h100-80gb"], layers, base, world))
                print(f"{name} x{world} {strategy}: {wall:.1f} s, {format_bytes(rss)}", file=sys.stderr)
                head = {"model": name, "ranks": str(world), "strategy": strategy, "wall": f"{wall:.1f} s"}
                rows.append({**head, "peak RSS": format_bytes(rss), **row(answers[0])})
    print("FSDP2 per rank on h100-80gb (one rank traced; CUDA figures modelled, unverified):\n")
    print(table(rows))


if __name__ == "__main__":
    main()
