"""Factories for test data: small specs that run in well under a second on CPU."""

from __future__ import annotations

import copy
import math
from typing import Any

from ckptlab.spec.experiment import ExperimentSpec

TINY: dict[str, Any] = {
    "model": {"kind": "mlp", "depth": 8, "width": 64, "dropout": 0.0},
    "batch_size": 16,
    "steps": 3,
    "warmup_steps": 1,
    "timed_steps": 0,  # timings from the memory steps: tests count steps; timing tests set it
    "memory_early_stop": False,  # every memory step runs: tests count steps; memory-pass tests set it
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


#: Tiny configs of every ``hf`` architecture (2-3 blocks, a few thousand parameters).
HF_TINY: dict[str, dict[str, Any]] = {
    "gpt2": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "vocab_size": 100, "seq_len": 16},
    "llama": {
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 100,
        "seq_len": 16,
    },
    "mistral": {
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 64,
        "vocab_size": 100,
        "seq_len": 16,
    },
    "resnet": {
        "embedding_size": 8,
        "hidden_sizes": [8, 16],
        "depths": [1, 2],
        "layer_type": "basic",
        "num_labels": 4,
        "image_size": 32,
    },
    "convnext": {"hidden_sizes": [8, 16], "depths": [1, 2], "num_labels": 4, "image_size": 32},
    "vit": {
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "patch_size": 8,
        "num_labels": 4,
        "image_size": 32,
    },
    "swin": {
        "embed_dim": 16,
        "depths": [1, 1, 1],
        "num_heads": [1, 2, 4],
        "window_size": 2,
        "patch_size": 4,
        "num_labels": 4,
        "image_size": 32,
    },
}
HF_TINY["qwen2"] = dict(HF_TINY["mistral"])  # same grouped-query shape, another family


def hf_model(architecture: str, **overrides: Any) -> dict[str, Any]:
    """The ``model`` of a tiny ``hf`` spec (:data:`HF_TINY`), with ``overrides``."""
    return {"kind": "hf", "architecture": architecture, **HF_TINY[architecture], **overrides}


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


def varied_step_record(step: int) -> dict[str, Any]:
    """A step record whose values vary with the step (for series and rollups): step times
    with spikes at 1234 (90 ms) and 4321 (70 ms) and a dip at 5000 (0.5 ms), peaks that jump
    around, NaN losses every 4th step, no reserved bytes (CPU)."""
    return {
        "step": step,
        "forward_ms": 1.0 + (step % 7) / 10,
        "backward_ms": 2.0 + (step % 5) / 10,
        "optimizer_ms": 0.5,
        "step_ms": {1234: 90.0, 4321: 70.0, 5000: 0.5}.get(step, 3.0 + (step % 11) / 10),
        "allocated_bytes": 1000 + step % 13,
        "peak_allocated_bytes": 2000 + (step * 7919) % 1009,
        "reserved_bytes": None,
        "loss": math.nan if step % 4 == 0 else 1.0 / step,
        "extra": {"pass": "memory"},
    }


def sweep_row(
    experiment_id: int,
    *,
    segments: int | None = None,
    peak: float = 1_000_000,
    activations: float = 100_000,
    step_ms: float = 10.0,
    jitter: float = 0.05,
    baseline_id: int = 1,
    **fields: Any,
):
    """A :class:`ckptlab.backend.services.sweeps.SweepRow` of a sequential run with ``segments`` (a
    ``none`` baseline when None): 20 timed steps around ``step_ms`` (seeded ±``jitter``)."""
    import random

    from ckptlab.backend.services.sweeps import SweepRow

    rng = random.Random(experiment_id)
    baseline = segments is None
    row = SweepRow(
        experiment_id=experiment_id,
        status=fields.pop("status", "succeeded"),
        role="baseline" if baseline else "run",
        values={"checkpoint.segments": segments},
        group={},
        baseline_id=baseline_id,
        metrics={"peak_allocated_bytes": peak, "activation_bytes": activations, "step_time_ms": step_ms},
        gradients_match=fields.pop("gradients_match", None if baseline else True),
        error=None,
        label="base" if baseline else f"segments={segments}",
        strategy="none" if baseline else "sequential",
        simplicity=(0, 0) if baseline else (1, segments),
        step_times_ms=[step_ms * (1 + rng.uniform(-jitter, jitter)) for _ in range(20)],
    )
    for key, value in fields.items():
        setattr(row, key, value)
    return row


#: Small models for sharded runs (seconds per run with two CPU ranks).
SHARDED_MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"kind": "mlp", "depth": 4, "width": 64, "dropout": 0.0},
    "transformer": {"kind": "transformer", "depth": 2, "d_model": 32, "heads": 2, "seq_len": 16, "vocab_size": 100},
    "hf-llama": {"kind": "hf", "architecture": "llama", **HF_TINY["llama"]},
}


#: Small models of six kinds for checks of ``auto`` against per_block, as ``make_spec``
#: overrides (each run well under a second on an idle CPU): an MLP with dropout (whose
#: checkpoints keep RNG states), the built-in transformer, a DenseNet and tiny Hugging Face
#: GPT-2 (its forward frees more of its stem's tensors than its head's backward leaves:
#: issue 31), Llama and ViT.
PLANNER_MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"model": {"kind": "mlp", "depth": 8, "width": 256, "dropout": 0.1}, "batch_size": 256},
    "transformer": {
        "model": {"kind": "transformer", "depth": 4, "d_model": 64, "heads": 4, "seq_len": 64, "vocab_size": 500},
        "batch_size": 4,
    },
    "densenet": {
        "model": {"kind": "densenet", "depth": 4, "growth_rate": 8, "bn_size": 2, "image_size": 16},
        "batch_size": 8,
    },
    "hf-gpt2": {"model": hf_model("gpt2", seq_len=64), "batch_size": 4},
    "hf-llama": {"model": hf_model("llama", seq_len=64), "batch_size": 4},
    "hf-vit": {"model": hf_model("vit"), "batch_size": 8},
}

#: Issue 31's Hugging Face GPT-2 (4 layers, hidden 128, 4 heads, seq_len 256, vocab 1000,
#: batch 4, fp32, CPU), as ``make_spec`` overrides: per_block measures 48,845,980 B there.
ISSUE31_GPT2: dict[str, Any] = {
    "model": {
        "kind": "hf",
        "architecture": "gpt2",
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "seq_len": 256,
        "vocab_size": 1000,
    },
    "batch_size": 4,
}


def sharded_spec(model: str, strategy: str, kind: str = "fsdp2", world_size: int = 2, **distributed: Any):
    """A sharded spec of :data:`SHARDED_MODELS`: batch 4 per rank, 3 memory and 2 timed
    steps, non-reentrant checkpointing (``auto``: a 1 GiB budget)."""
    checkpoint: dict[str, Any] = {"strategy": strategy, "use_reentrant": False}
    if strategy == "auto":
        checkpoint["budget_bytes"] = 2**30
    return make_spec(
        model=SHARDED_MODELS[model],
        batch_size=4,
        steps=3,
        timed_steps=2,
        checkpoint=checkpoint,
        distributed={"kind": kind, "world_size": world_size, **distributed},
    )


#: Values that do not read back, per database and column (issue 33): SQLite stores any text
#: in any column; PostgreSQL refuses invalid JSON, a timestamp or an integer that is not
#: one, so there a JSON value of the wrong shape or content.
CORRUPT_VALUES: dict[str, dict[str, str]] = {
    "sqlite": {
        "summary": "garbage{",
        "spec": "garbage{",
        "warnings": "nope",
        "created_at": "not a date",
        "attempt": "abc",
        "axes": "garbage{",
        "base": "{",
    },
    "postgresql": {
        "summary": '{"peak_allocated_bytes": "x"}',
        "spec": '"a string"',
        "warnings": "[1]",
        "axes": '"x"',
        "base": "[1]",
    },
}


def corrupt(session: Any, table: str, row_id: int, column: str, value: str | None = None) -> str:
    """Write ``value`` (default: the database's :data:`CORRUPT_VALUES` entry) into one column of
    one row with plain SQL, as a hand edit would, and commit; returns the value written."""
    from sqlalchemy import text

    dialect = session.get_bind().dialect.name
    value = CORRUPT_VALUES[dialect][column] if value is None else value
    literal = "'" + value.replace("'", "''") + "'"  # a constant of the tests: no injection
    session.execute(text(f"UPDATE {table} SET {column} = {literal} WHERE id = :id"), {"id": row_id})
    session.commit()
    return value


def paired_summary(estimate: float, low: float, high: float) -> dict[str, Any]:
    """A run summary's paired-timing fields (merge into a summary dict): the stored
    ``paired_overhead`` (%, its 95% CI, 20 rounds on CPU time) and rounds that agree with it
    (baseline 100 ms, the run ``100 + estimate`` ms)."""
    return {
        "paired_overhead": {
            "estimate_pct": estimate,
            "low_pct": low,
            "high_pct": high,
            "rounds": 20,
            "clock": "CPU time",
        },
        "paired_baseline_step_times_ms": [100.0] * 20,
        "paired_baseline_cpu_ms": [100.0] * 20,
        "step_cpu_ms": [100.0 + estimate] * 20,
    }
