"""Factories for test data: small specs that run in well under a second on CPU."""

from __future__ import annotations

import copy
from typing import Any

from ckptlab.spec import ExperimentSpec

TINY: dict[str, Any] = {
    "model": {"kind": "mlp", "depth": 8, "width": 64, "dropout": 0.0},
    "batch_size": 16,
    "steps": 3,
    "warmup_steps": 1,
    "checkpoint": {"strategy": "none", "segments": 1, "use_reentrant": False, "preserve_rng_state": True},
    "amp": "off",
    "optimizer": "adam",
    "device": "cpu",
    "seed": 0,
}


def spec_dict(**overrides: Any) -> dict[str, Any]:
    """A tiny spec as JSON-able dict. Dotted keys set nested fields:
    ``spec_dict(**{"checkpoint.segments": 4, "model.depth": 16})``."""
    d = copy.deepcopy(TINY)
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = d
        for p in parents:
            node = node[p]
        node[leaf] = value
    return d


def make_spec(**overrides: Any) -> ExperimentSpec:
    """A validated tiny :class:`ExperimentSpec` (see :func:`spec_dict`)."""
    return ExperimentSpec.model_validate(spec_dict(**overrides))


def step_record(step: int, loss: float = 1.0) -> dict[str, Any]:
    """A step record as the engine reports it (times in ms, memory in bytes)."""
    return {
        "step": step,
        "forward_ms": 1.0,
        "backward_ms": 2.0,
        "optimizer_ms": 0.5,
        "step_ms": 3.5,
        "allocated_bytes": 100,
        "peak_allocated_bytes": 200,
        "loss": loss,
    }
