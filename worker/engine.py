"""The experiment engine: train a model for a few steps under a checkpointing setting and
measure time and memory per step.

Measurement (per step):

- ``forward_ms``, ``backward_ms``, ``optimizer_ms``, ``step_ms``: wall time in ms from
  ``time.perf_counter``; on CUDA each phase ends with ``torch.cuda.synchronize``.
- ``allocated_bytes``: live tensor bytes at the end of forward (loss computed).
- ``peak_allocated_bytes``: highest live tensor bytes during the step (forward, backward,
  optimizer).
- On CPU both come from :class:`worker.memory.LiveTensorTracker`; on CUDA from
  ``torch.cuda.memory_allocated`` / ``max_memory_allocated`` (and ``reserved_bytes`` from
  ``memory_reserved``).

Summary: ``activation_bytes`` is the median over measured steps of live bytes at the end of
forward minus live bytes just before it: the bytes autograd keeps for backward.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint_sequential

from ckptlab.spec import ExperimentSpec
from worker.memory import CudaProbe, LiveTensorTracker
from worker.models import Built, build_model

__all__ = ["resolve_device", "run_experiment", "StepCallback"]

StepCallback = Callable[[dict[str, Any]], None]


def resolve_device(requested: str) -> torch.device:
    """Map the spec's ``device`` to a ``torch.device``.

    ``auto`` picks ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``.
    Raises ValueError when ``cuda`` is requested and CUDA is not available.
    """
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available on this worker; use 'auto' or 'cpu'")
    return torch.device(requested)


def _forward(built: Built, spec: ExperimentSpec, x: torch.Tensor) -> torch.Tensor:
    h = built.stem(x)
    ck = spec.checkpoint
    if ck.strategy == "sequential":
        # PyTorch doc (torch.utils.checkpoint.checkpoint_sequential): segments of
        # len // segments blocks; the last segment is run without checkpointing.
        h = checkpoint_sequential(
            built.blocks,
            ck.segments,
            h,
            use_reentrant=ck.use_reentrant,
            preserve_rng_state=ck.preserve_rng_state,
        )
    else:
        h = built.blocks(h)
    return built.head(h)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run_experiment(spec: ExperimentSpec, *, on_step: StepCallback | None = None) -> dict[str, Any]:
    """Run ``spec`` and return its summary; ``on_step(record)`` gets each step as it ends.

    Args:
        spec: a validated experiment spec.
        on_step: called with a dict per step: ``step`` (1-based), the ``*_ms`` timings,
            ``allocated_bytes``, ``peak_allocated_bytes``, ``reserved_bytes`` (CUDA only,
            else None), ``activation_bytes`` and ``loss`` (may be non-finite). Default: None.

    Returns:
        dict with ``device``, ``activation_bytes``, ``peak_allocated_bytes`` (max over
        measured steps), ``step_time_ms`` (median, warm-up excluded), the phase medians,
        ``params_without_grad`` (parameters whose ``.grad`` is None after backward, max over
        steps), ``param_count``, ``final_loss``, ``warnings`` and ``torch_version``.

    Raises:
        ValueError: the device cannot be used. Anything the model raises (including
        ``torch.OutOfMemoryError`` and ``torch.utils.checkpoint.CheckpointError``) propagates.
    """
    device = resolve_device(spec.device)
    cuda = device.type == "cuda"
    torch.manual_seed(spec.seed)
    gen = torch.Generator().manual_seed(spec.seed)

    if cuda:
        probe: CudaProbe | LiveTensorTracker = CudaProbe(device)
        mode: contextlib.AbstractContextManager = contextlib.nullcontext()
    else:
        probe = LiveTensorTracker()
        mode = probe

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    records: list[dict[str, Any]] = []
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as wlist, mode:
        warnings.simplefilter("always")
        built = build_model(spec.model)
        model = built.modules().to(device)
        params = list(model.parameters())
        if spec.optimizer == "adam":
            opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=1e-4)
        else:
            opt = torch.optim.SGD(params, lr=1e-3)
        autocast = (
            (lambda: torch.autocast(device.type, dtype=torch.bfloat16))
            if spec.amp == "bf16"
            else contextlib.nullcontext
        )
        for step in range(1, spec.steps + 1):
            x, y = built.make_batch(spec.batch_size, gen)
            x, y = x.to(device), y.to(device)
            sync()
            probe.reset_peak()
            before = probe.live_bytes
            t0 = time.perf_counter()
            with autocast():
                out = _forward(built, spec, x)
            loss = built.loss_fn(out, y)
            sync()
            t1 = time.perf_counter()
            after_forward = probe.live_bytes
            loss.backward()
            sync()
            t2 = time.perf_counter()
            missing = sum(p.grad is None for p in params)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            t3 = time.perf_counter()
            loss_value = float(loss.detach().float().item())
            del out, loss, x, y
            rec = {
                "step": step,
                "forward_ms": (t1 - t0) * 1e3,
                "backward_ms": (t2 - t1) * 1e3,
                "optimizer_ms": (t3 - t2) * 1e3,
                "step_ms": (t3 - t0) * 1e3,
                "allocated_bytes": after_forward,
                "peak_allocated_bytes": probe.peak_bytes,
                "reserved_bytes": probe.reserved_bytes if cuda else None,
                "activation_bytes": after_forward - before,
                "params_without_grad": missing,
                "loss": loss_value,
            }
            records.append(rec)
            if on_step is not None:
                on_step(rec)
        caught = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in wlist))

    measured = records[spec.warmup_steps :] or records
    final_loss = records[-1]["loss"]
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "activation_bytes": int(_median([r["activation_bytes"] for r in measured])),
        "peak_allocated_bytes": max(r["peak_allocated_bytes"] for r in measured),
        "step_time_ms": _median([r["step_ms"] for r in measured]),
        "forward_ms": _median([r["forward_ms"] for r in measured]),
        "backward_ms": _median([r["backward_ms"] for r in measured]),
        "optimizer_ms": _median([r["optimizer_ms"] for r in measured]),
        "params_without_grad": max(r["params_without_grad"] for r in records),
        "param_count": sum(p.numel() for p in params),
        "final_loss": final_loss if math.isfinite(final_loss) else None,
        "warnings": caught,
        "torch_version": torch.__version__,
    }
