"""Schema of ``GET /api/meta``: the vocabulary and field rules the frontend reads from the
server instead of spelling them again."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ckptlab.backend.schemas.common import examples
from ckptlab.domain import MemoryCategory, Status
from ckptlab.prediction.targets import TARGETS, target_names
from ckptlab.spec import model_kinds as _builtin_kinds  # noqa: F401  (registers the built-in kinds)
from ckptlab.spec.kinds import MODEL_KIND_TABLE, model_kind_names
from ckptlab.spec.presets import PRESETS
from ckptlab.strategies import STRATEGIES, SelectivePolicy, strategy_names

__all__ = ["StatusPublic", "MetaPublic"]


class StatusPublic(BaseModel):
    """One experiment status (:class:`ckptlab.domain.Status`)."""

    name: Status
    finished: bool = Field(description="a final status: no worker changes it again")


class MetaPublic(BaseModel):
    """Everything a client needs to build a spec form and label results: statuses, memory
    categories, the model-kind and strategy tables, the choices of each enumerated spec field,
    the per-step metrics, the chart names, the server's sweep limit, the spec's JSON schema
    (defaults and bounds) and the prediction targets."""

    model_config = examples(
        {
            "statuses": [{"name": Status.QUEUED, "finished": False}],
            "memory_categories": [c.value for c in MemoryCategory],
            "model_kinds": model_kind_names(),
            "model_kind_table": [MODEL_KIND_TABLE[name].public() for name in model_kind_names()][:1],
            "strategies": strategy_names(),
            "strategy_table": [STRATEGIES[name].public() for name in strategy_names()][:2],
            "policies": [p.value for p in SelectivePolicy],
            "sweep_axes": {"checkpoint.segments": ["segments", "segment count", "segment counts"]},
            "presets": {"tiny": PRESETS["tiny"]},
            "series_metrics": ["step_ms", "peak_allocated_bytes", "loss"],
            "chart_names": ["memory_vs_segments", "time_vs_segments", "pareto", "correctness"],
            "max_sweep_size": 256,
            "write_token_required": False,
            "spec_schema": {"title": "ExperimentSpec", "type": "object"},
            "torchvision_architectures": {"resnet50": 16},
            "hf_architectures": {
                "llama": {
                    "family": "causal_lm",
                    "config_class": "LlamaConfig",
                    "blocks": "model.layers (LlamaDecoderLayer)",
                    "attention": True,
                    "fields": {"hidden_size": {"type": "int", "default": 4096, "minimum": 8, "maximum": 16384}},
                }
            },
            "targets": [TARGETS[name].public() for name in target_names()][:2],
        }
    )

    statuses: list[StatusPublic] = Field(description="every status, in lifecycle order")
    memory_categories: list[str] = Field(description="what live bytes are for (keys of memory_at_peak)")
    model_kinds: list[str] = Field(description="values of model.kind, by rank")
    model_kind_table: list[dict[str, Any]] = Field(
        description="each model kind: name, summary (the form's option text), label template over the model's "
        "fields, example (the form's starting values), rank, default, its fields (type, title, default, minimum, "
        "maximum, enum, description, from the spec class's JSON schema), note, option_text, renderer, and whether "
        "the server checks its parameter limit (parameter_limit_checked; parameter_limit_note says why not)"
    )
    strategies: list[str] = Field(description="values of checkpoint.strategy, simplest first")
    strategy_table: list[dict[str, Any]] = Field(
        description="each strategy: name, summary, label template, the checkpoint fields it reads, "
        "whether it recomputes and needs use_reentrant false, its sort rank, sweep_default"
    )
    policies: list[str] = Field(description="values of checkpoint.policy (strategy selective)")
    sweep_axes: dict[str, list[str]] = Field(
        description="well-known sweep axis paths: [short name, one value, several values]"
    )
    presets: dict[str, dict[str, Any]] = Field(description="the form's presets: name -> {spec, axes}")
    series_metrics: list[str] = Field(description="metrics GET /api/experiments/{id}/series accepts")
    chart_names: list[str] = Field(description="charts GET /api/sweeps/{id}/charts/{name} draws")
    max_sweep_size: int = Field(description="most experiments one sweep may queue, baselines included")
    write_token_required: bool = Field(
        description="writes need 'Authorization: Bearer <token>' (the server sets CKPTLAB_API_TOKEN)"
    )
    spec_schema: dict[str, Any] = Field(description="JSON schema of the experiment spec (defaults, bounds)")
    torchvision_architectures: dict[str, int] = Field(
        description="model kind torchvision: each architecture and its number of blocks"
    )
    hf_architectures: dict[str, dict[str, Any]] = Field(
        description="model kind hf: each architecture's family, blocks and config fields (type, default, bounds)"
    )
    targets: list[dict[str, Any]] = Field(
        description="the devices a prediction can name (POST /api/predictions target), cpu first, then by "
        "capacity: name, label, device, capacity_bytes, compute_capability, block_bytes, "
        "cublas_workspace_bytes, context_bytes, verified (a scripts/gpu-check run measured it)"
    )
