"""Example requests: the API's example spec and the form's presets, as data.

These are requests a user would send, so they name strategies and fields as a request
does; everything else reads names from :mod:`ckptlab.strategies` and
:mod:`ckptlab.domain`. The frontend reads :data:`PRESETS` through ``GET /api/meta``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EXAMPLE_SPEC", "EXAMPLE_SWEEP", "PRESETS"]

#: The API's example experiment request (OpenAPI ``examples``).
EXAMPLE_SPEC: dict[str, Any] = {
    "model": {"kind": "mlp", "depth": 32, "width": 1024, "dropout": 0.0},
    "batch_size": 64,
    "steps": 5,
    "warmup_steps": 1,
    "checkpoint": {
        "strategy": "sequential",
        "segments": 4,
        "use_reentrant": False,
        "preserve_rng_state": True,
    },
    "amp": "off",
    "optimizer": "adam",
    "device": "auto",
    "seed": 0,
}

#: The API's example sweep request: segments x RNG preservation x AMP of a small MLP.
EXAMPLE_SWEEP: dict[str, Any] = {
    "name": "segments x rng x amp",
    "base": {
        "model": {"kind": "mlp", "depth": 8, "width": 64},
        "batch_size": 16,
        "steps": 3,
        "device": "cpu",
        "checkpoint": {"strategy": "sequential"},
    },
    "axes": {
        "checkpoint.segments": [1, 2, 4, 8],
        "checkpoint.preserve_rng_state": [True, False],
        "amp": ["off", "bf16"],
    },
}


def _spec(model: dict[str, Any], checkpoint: dict[str, Any], **rest: Any) -> dict[str, Any]:
    base = {"batch_size": 64, "steps": 5, "warmup_steps": 1, "grad_accum_steps": 1, "amp": "off"}
    flags = {"use_reentrant": False, "preserve_rng_state": True}
    return {"model": model, **base, "checkpoint": {**checkpoint, **flags}, "optimizer": "adam", **rest}


#: The form's presets (``#/new?preset=NAME``): the seed documents' experiments
#: (../shared/docs/domain.md) plus a quick CPU check. Each has a spec and sweep axes (the
#: form's comma-separated text per axis path).
PRESETS: dict[str, dict[str, Any]] = {
    "mlp72": {
        "spec": _spec(
            {"kind": "mlp", "depth": 72, "width": 1000, "dropout": 0, "stem": True},
            {"strategy": "sequential", "segments": 4},
            batch_size=256,
            device="auto",
            seed=0,
        ),
        "axes": {"checkpoint.segments": "1,2,4,8,16,36"},
    },
    "resnet": {
        "spec": _spec(
            {"kind": "resnet", "depth": 9, "channels": 16, "image_size": 64, "dropout": 0},
            {"strategy": "sequential", "segments": 3},
            batch_size=8,
            device="auto",
            seed=0,
        ),
        "axes": {"checkpoint.segments": "1,3,9"},
    },
    "gpt": {
        "spec": _spec(
            {"kind": "transformer", "depth": 6, "d_model": 256, "heads": 4, "seq_len": 256, "vocab_size": 1000}
            | {"dropout": 0},
            {"strategy": "per_block", "every": 1, "policy": "save_matmuls"},
            batch_size=8,
            optimizer="adamw",
            device="auto",
            seed=0,
        ),
        "axes": {"checkpoint.segments": "1,2,3,6", "checkpoint.every": "1,2,3"},
    },
    # Activations dominate (batch 2048 x width 128: 1 MiB per layer output against 0.5 MiB of
    # parameters, gradients and Adam state per layer), so its sweep shows the segment
    # trade-off in seconds on a CPU: measured 13.8, 10.8, 10.8, 13.9 MiB at 1, 2, 4, 8
    # segments (the optimum near sqrt(8); domain.md). At 8 x 64 and batch 16 every peak was
    # 1.12 MiB: fixed memory alone, nothing for checkpointing to show (issue 32).
    "tiny": {
        "spec": _spec(
            {"kind": "mlp", "depth": 8, "width": 128, "dropout": 0, "stem": True},
            {"strategy": "sequential", "segments": 2},
            batch_size=2048,
            steps=3,
            device="cpu",
            seed=0,
        ),
        "axes": {"checkpoint.segments": "1,2,4,8"},
    },
}
