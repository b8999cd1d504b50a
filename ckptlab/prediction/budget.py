"""Strategy ``auto``'s memory budget in a prediction: the target's default when the spec
gives none. Pure arithmetic on the targets table (:mod:`ckptlab.prediction.targets`); the
backend reads it to accept a planned spec without ``checkpoint.budget_bytes``, the prediction
process to fill it per target."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptlab.prediction.targets import Target
from ckptlab.strategies import get_strategy

__all__ = ["BUDGET_MARGIN", "default_budget_bytes", "needs_budget", "with_default_budget"]

#: The share of a GPU's capacity that strategy ``auto``'s default budget leaves free: room
#: for the caching allocator's reserved-but-unallocated bytes (fragmentation).
BUDGET_MARGIN = 0.05


def default_budget_bytes(target: Target, capacity_bytes: int | None = None) -> int | None:
    """Strategy ``auto``'s budget on ``target`` when the spec gives none: the capacity
    (``capacity_bytes``, else the target's) less the CUDA context, the cuBLAS workspaces (forward's and backward's) and
    :data:`BUDGET_MARGIN` of the capacity (bytes, at least 1); None without a capacity
    (``cpu``). Llama-3-8B on ``h100-80gb``: 85,520,809,984 − 600 MiB − 2 × 32 MiB − 5% =
    about 75.0 GiB."""
    capacity = capacity_bytes if capacity_bytes is not None else target.capacity_bytes
    if capacity is None:
        return None
    spare = target.context_bytes + target.cublas_workspaces_bytes + int(BUDGET_MARGIN * capacity)
    return max(capacity - spare, 1)


def needs_budget(spec: Mapping[str, Any]) -> bool:
    """Whether ``spec`` (an experiment spec as JSON, not yet validated) names a planned
    strategy (``auto``) and no ``checkpoint.budget_bytes``: a prediction then plans for each
    target's :func:`default_budget_bytes`. False for anything malformed (validation says why)."""
    checkpoint = spec.get("checkpoint")
    if not isinstance(checkpoint, Mapping):
        return False
    try:
        planned = get_strategy(checkpoint.get("strategy", "")).planned
    except (ValueError, KeyError, TypeError):
        return False
    return planned and checkpoint.get("budget_bytes") is None


def with_default_budget(spec: Mapping[str, Any], target: Target, capacity_bytes: int | None = None) -> dict[str, Any]:
    """``spec`` (JSON) with ``checkpoint.budget_bytes`` set to ``target``'s
    :func:`default_budget_bytes` when :func:`needs_budget`; otherwise (a budget given, no
    planned strategy, or no capacity to derive one from: validation then asks for the
    budget) ``spec`` unchanged, as a new dict."""
    budget = default_budget_bytes(target, capacity_bytes) if needs_budget(spec) else None
    if budget is None:
        return dict(spec)
    return {**spec, "checkpoint": {**spec["checkpoint"], "budget_bytes": budget}}
