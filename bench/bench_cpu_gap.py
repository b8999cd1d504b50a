"""What CPU memory figures omit: the exact live-tensor tracker against the CPU allocator
(``torch.profiler`` memory events, :class:`ckptlab.worker.measure.allocator_probe.CpuAllocatorProbe`) on the
built-in models, one training step each (issue 19).

For each model: the bytes a forward keeps and the forward-and-backward peak above the step's
start, read by both, in the same process, the second step of two (the first allocates the
gradients). The tracker counts tensor storages (what ATen ops return, and the RNG states
checkpoints keep); the allocator also holds what kernels allocate for themselves and free
before returning (convolution backward's scratch, for one), which no tensor holds.

Usage: python bench/bench_cpu_gap.py [--threads N]
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from ckptlab.analysis.explain import format_bytes  # noqa: E402
from ckptlab.spec.experiment import ExperimentSpec  # noqa: E402
from ckptlab.worker.measure.allocator_probe import CpuAllocatorProbe  # noqa: E402
from ckptlab.worker.measure.memory import LiveTensorTracker  # noqa: E402
from ckptlab.worker.models.build import build_model  # noqa: E402

CASES = [
    (
        "ResNet generator 8 blocks, 8 ch, 32 px, batch 8",
        {"kind": "resnet", "depth": 8, "channels": 8, "image_size": 32},
        8,
    ),
    (
        "ResNet generator 8 blocks, 32 ch, 64 px, batch 8",
        {"kind": "resnet", "depth": 8, "channels": 32, "image_size": 64},
        8,
    ),
    ("DenseNet (defaults), batch 8", {"kind": "densenet"}, 8),
    ("MLP 16×256, batch 512", {"kind": "mlp", "depth": 16, "width": 256}, 512),
    (
        "transformer 8×128, seq 128, batch 8",
        {"kind": "transformer", "depth": 8, "d_model": 128, "heads": 4, "seq_len": 128, "vocab_size": 1000},
        8,
    ),
]


def read(probe_type: type, model: dict, batch: int) -> tuple[int, int]:
    """(bytes the forward keeps, forward-and-backward peak above the step's start), step 2."""
    spec = ExperimentSpec.model_validate({"model": model, "batch_size": batch, "device": "cpu"})
    gc.collect()
    with probe_type() as probe:
        torch.manual_seed(0)
        built = build_model(spec.model)
        gen = torch.Generator().manual_seed(0)
        for _ in range(2):
            x, y = built.make_batch(batch, gen)
            start = probe.live_bytes
            probe.reset_peak()
            loss = built.loss_fn(built.module(x), y)
            kept = probe.live_bytes - start
            loss.backward()
            peak = probe.peak_bytes - start
            del loss, x, y
            for p in built.module.parameters():
                p.grad = None
        del built
    return kept, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)\n")
    print("| model | kept after forward: tracker / allocator | peak above step start: tracker / allocator | gap |")
    print("|---|---|---|---:|")
    for name, model, batch in CASES:
        (tk, tp), (ak, ap) = read(LiveTensorTracker, model, batch), read(CpuAllocatorProbe, model, batch)
        print(
            f"| {name} | {format_bytes(tk)} / {format_bytes(ak)} | {format_bytes(tp)} / {format_bytes(ap)} "
            f"| {100 * (ap - tp) / tp:+.1f}% |",
            flush=True,
        )


if __name__ == "__main__":
    main()
