"""Schemas of a run's memory timeline (issue 34): one step's live bytes over its events,
downsampled, and who holds its peak (:mod:`ckptlab.analysis.timeline`). Bytes; event
indices (``t_index``: the order of the allocations and frees)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ckptlab.backend.schemas.common import examples
from ckptlab.domain import MemoryCategory

__all__ = ["MAX_TIMELINE_POINTS", "MAX_HOLDERS", "SpanPublic", "TimelinePublic", "HolderPublic", "PeakHoldersPublic"]

#: The most points a timeline request may ask for.
MAX_TIMELINE_POINTS = 100_000
#: The most peak holders a request may ask to see by name.
MAX_HOLDERS = 1000

_ACT, _PARAMS, _OTHER = (MemoryCategory.ACTIVATIONS.value, MemoryCategory.PARAMETERS.value, MemoryCategory.OTHER.value)


class SpanPublic(BaseModel):
    """A span of events: ``start`` to ``end`` (end exclusive), in a phase or a recomputation."""

    model_config = examples({"phase": "backward", "start": 120, "end": 260})

    phase: str | None = Field(None, description="forward, backward or optimizer (null for a recomputation)")
    start: int = Field(description="first event index")
    end: int = Field(description="event index after the last")


class TimelinePublic(BaseModel):
    """One step's memory timeline: live bytes after each event, at most ``max_points`` of them
    (MinMaxLTTB over the live bytes, the peak always kept, exact), stacked by category, with
    the module and op of each point's event, the phases and the recomputations. A run's names
    its ``experiment_id`` and ``attempt``; a prediction's its ``prediction_id`` and
    ``target``: the fake tensors' bytes as the live-tensor tracker counted them."""

    model_config = examples(
        {
            "experiment_id": 1,
            "attempt": 1,
            "step": 2,
            "steps": [1, 2],
            "peak_step": 2,
            "n_events": 3,
            "downsampled": False,
            "baseline_bytes": 1000,
            "peak_bytes": 1600,
            "peak_index": 1,
            "t_index": [0, 1, 2],
            "live_bytes": [1200, 1600, 1400],
            "by_category": {_PARAMS: [1000, 1000, 1000], _ACT: [200, 600, 400], _OTHER: [0, 0, 0]},
            "bytes_delta": [200, 400, -200],
            "module": ["blocks.0.mlp", "blocks.1.mlp", "blocks.0.mlp"],
            "op": ["aten.addmm.default", "aten.addmm.default", "aten.addmm.default"],
            "saved_for_backward": [True, True, True],
            "checkpoint_region": [None, None, None],
            "phases": [{"phase": "forward", "start": 0, "end": 3}],
            "recomputations": [],
        }
    )

    experiment_id: int | None = Field(None, description="the run's experiment (null for a prediction's timeline)")
    attempt: int | None = Field(None, description="the run's attempt read (null for a prediction's timeline)")
    prediction_id: int | None = Field(None, description="the prediction (null for a run's timeline)")
    target: str | None = Field(
        None,
        description="the prediction's target (null for a run's timeline); on cpu the timeline's peak is the "
        "predicted peak to the byte; on a CUDA target the timeline is the fake tensor count (each block rounded to "
        "512 B) and the predicted peak adds the cuBLAS workspaces to it (reserved bytes and the CUDA context are "
        "modelled apart), so its peak is below the predicted peak",
    )
    step: int = Field(description="the step shown")
    steps: list[int] = Field(description="the steps with a timeline: the first step and the run's peak step")
    peak_step: int | None = Field(description="the step that reached the run's peak (summary's peak_allocated_bytes)")
    n_events: int = Field(description="allocations and frees in the step")
    downsampled: bool = Field(description="whether fewer points than events are returned")
    baseline_bytes: int = Field(description="live bytes as the step began")
    peak_bytes: int = Field(description="the step's highest live bytes, exact")
    peak_index: int = Field(description="the event that reached it (-1: the step's start)")
    t_index: list[int] = Field(description="event index of each point, ascending")
    live_bytes: list[int] = Field(description="live bytes just after each point's event")
    by_category: dict[str, list[int]] = Field(
        description="live bytes per memory category at each point (categories with bytes only); they sum to live_bytes"
    )
    bytes_delta: list[int] = Field(description="each point's event: bytes allocated (+) or freed (-)")
    module: list[str] = Field(description="fully-qualified name of the module that made the event's block")
    op: list[str] = Field(description="the op that made the event's block (aten.mm.default, torch.get_rng_state)")
    saved_for_backward: list[bool] = Field(description="whether the event's block was saved for backward")
    checkpoint_region: list[str | None] = Field(description="the checkpoint region the block was made in, or null")
    phases: list[SpanPublic] = Field(description="forward, backward and optimizer spans")
    recomputations: list[SpanPublic] = Field(description="spans of events inside a checkpoint's recomputation")
    region_keeps: list[dict[str, Any]] = Field(
        default_factory=list,
        description="per checkpointed region: the bytes its checkpoint meant to keep (inputs_bytes, rng_state_bytes, "
        "policy_bytes: intended_bytes) against what it kept at the end of forward (kept_bytes); excess_bytes the "
        "difference, excess its largest blocks (module, op, bytes)",
    )


class HolderPublic(BaseModel):
    """Bytes alive at the peak made by one module, of one category, saved for backward or not."""

    model_config = examples(
        {
            "module": "blocks.0.mlp.0",
            "category": _ACT,
            "saved": True,
            "bytes": 131072,
            "share": 0.07,
            "blocks": 1,
            "recomputed_bytes": 0,
            "ops": ["aten.addmm.default"],
        }
    )

    module: str = Field(
        description="fully-qualified module name; '<batch>', '<loss>' or '<optimizer>' outside every module; 'unknown'"
    )
    category: str = Field(description="memory category (GET /api/meta's memory_categories)")
    saved: bool = Field(description="saved for backward (true) or temporary")
    bytes: int
    share: float = Field(description="bytes / peak_bytes")
    blocks: int = Field(description="storages in the group")
    recomputed_bytes: int = Field(description="of bytes, those a recomputation made")
    ops: list[str] = Field(description="ops that made its largest blocks (up to 3)")


class PeakHoldersPublic(BaseModel):
    """Who holds one step's peak: the blocks alive at it grouped by (module, category, saved vs
    temporary), largest first; ``holders`` (the top ``top``) and ``others`` sum to
    ``peak_bytes`` exactly."""

    model_config = examples(
        {
            "experiment_id": 1,
            "attempt": 1,
            "step": 2,
            "peak_bytes": 1600,
            "peak_index": 1,
            "phase": "forward",
            "named_bytes": 1600,
            "unknown_bytes": 0,
            "groups": 2,
            "holders": [],
            "others_bytes": 0,
            "others_groups": 0,
            "by_category": {_PARAMS: 1000, _ACT: 600},
        }
    )

    experiment_id: int
    attempt: int
    step: int
    peak_bytes: int = Field(description="live bytes at the step's peak, exact")
    peak_index: int = Field(description="the event that reached it (-1: the step's start)")
    phase: str | None = Field(description="the phase of that event")
    named_bytes: int = Field(description="bytes attributed to a module (not 'unknown')")
    unknown_bytes: int = Field(description="bytes nothing named")
    groups: int = Field(description="(module, category, saved) groups alive at the peak")
    holders: list[HolderPublic] = Field(description="the largest groups, largest first")
    others_bytes: int = Field(description="bytes of the groups past the top ones")
    others_groups: int = Field(description="how many groups those are")
    by_category: dict[str, int] = Field(description="bytes per memory category at the peak")
