"""Schemas of predictions ("will it fit?"): the request for one target or several, and a
stored prediction as the API shows it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from ckptlab.backend.schemas.common import EXAMPLE_SUMMARY, SummaryPublic, examples
from ckptlab.domain import Status
from ckptlab.prediction.budget import needs_budget
from ckptlab.prediction.targets import MAX_CAPACITY_BYTES, get_target, target_names
from ckptlab.spec.base import spec_int
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.presets import EXAMPLE_SPEC

__all__ = [
    "TargetName",
    "MAX_CAPACITY_BYTES",
    "PredictionCreate",
    "PredictionBatchCreate",
    "PredictionPublic",
    "PredictionsPublic",
]

_EXAMPLE_TARGET = "h100-80gb"


def _known_target(name: str) -> str:
    get_target(name)  # ValueError naming the known ones
    return name


def _target_enum(schema: dict[str, Any]) -> None:
    # Read at schema time, so a target registered after import is in the schema too.
    schema["enum"] = target_names()


#: A name of the targets table (:mod:`ckptlab.prediction.targets`), checked against the table
#: as it is when a request is validated; an unknown one is a 422 listing the known ones.
TargetName = Annotated[
    str,
    Field(strict=True, min_length=1, max_length=64, json_schema_extra=_target_enum),
    AfterValidator(_known_target),
]
CapacityBytes = Annotated[
    spec_int(gt=0, le=MAX_CAPACITY_BYTES) | None,
    Field(
        strict=True,
        description="the device's memory in bytes, instead of the target's (a board variant, or memory other "
        "processes hold); null: the target's",
    ),
]

_EXAMPLE_PREDICTION_SUMMARY = {
    **EXAMPLE_SUMMARY,
    "device": "cuda",
    "reserved_bytes": 10_485_760,
    "prediction": {
        "target": _EXAMPLE_TARGET,
        "method": "one training step with fake tensors under the live-tensor tracker, CUDA allocator modelled",
        "error_bound": "unverified on CUDA",
        "capacity_bytes": 85_520_809_984,
        "peak_reserved_bytes": 10_485_760,
        "device_used_bytes": 674_234_368,
        "fits": True,
        "margin_bytes": 84_846_575_616,
        "fixed_bytes": 4_227_072,
        "notes": [],
    },
}
_EXAMPLE_PREDICTION = {
    "id": 1,
    "status": Status.SUCCEEDED,
    "spec": EXAMPLE_SPEC,
    "target": _EXAMPLE_TARGET,
    "capacity_bytes": None,
    "created_at": "2026-01-01T12:00:00Z",
    "finished_at": "2026-01-01T12:00:04Z",
    "elapsed_s": 3.9,
    "summary": _EXAMPLE_PREDICTION_SUMMARY,
    "error": None,
}


class _PredictionRequest(BaseModel):
    """What both prediction requests share: a spec with strategy ``auto`` and no
    ``checkpoint.budget_bytes`` is accepted, and each target plans for its own default budget
    (:func:`ckptlab.prediction.budget.default_budget_bytes`: capacity less context, cuBLAS
    workspace and a 5% margin); ``cpu`` without ``capacity_bytes`` has none and that
    prediction fails saying so."""

    _budget_per_target: bool = PrivateAttr(default=False)

    @model_validator(mode="wrap")
    @classmethod
    def _planned_without_budget(cls, data: Any, handler: Any) -> Any:
        spec = data.get("spec") if isinstance(data, dict) else None
        per_target = isinstance(spec, dict) and needs_budget(spec)
        if per_target:
            # Validated with a stand-in budget (checks every other field); the process fills each target's.
            data = {**data, "spec": {**spec, "checkpoint": {**spec["checkpoint"], "budget_bytes": 1}}}
        model = handler(data)
        model._budget_per_target = per_target
        return model

    @property
    def budget_per_target(self) -> bool:
        """True when the spec's planned strategy gave no budget: each target's default applies."""
        return self._budget_per_target


class PredictionCreate(_PredictionRequest):
    """A prediction of one training step of ``spec`` on ``target``: its memory (allocated,
    reserved, device used) and whether it fits. The spec is validated as an experiment's
    (``POST /api/experiments``): a 422 names the field (``spec.model.depth``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"spec": EXAMPLE_SPEC, "target": _EXAMPLE_TARGET, "capacity_bytes": None}]},
    )

    spec: ExperimentSpec = Field(description="the experiment spec to predict (as in ExperimentCreate)")
    target: TargetName = Field(description="the device: a name of GET /api/meta's targets")
    capacity_bytes: CapacityBytes = None


class PredictionBatchCreate(_PredictionRequest):
    """Predictions of ``spec`` on several targets at once (one prediction process for all):
    what fits where."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"spec": EXAMPLE_SPEC, "targets": ["cpu", "l4-24gb", _EXAMPLE_TARGET]}]},
    )

    spec: ExperimentSpec = Field(description="the experiment spec to predict (as in ExperimentCreate)")
    targets: list[TargetName] = Field(
        min_length=1,
        max_length=64,
        description="names of GET /api/meta's targets, each at most once",
        json_schema_extra={"uniqueItems": True},
    )

    @field_validator("targets")
    @classmethod
    def _each_once(cls, targets: list[str]) -> list[str]:
        repeated = sorted({t for t in targets if targets.count(t) > 1})
        if repeated:
            raise ValueError(f"each target at most once; repeated: {', '.join(repeated)}")
        return targets


class PredictionPublic(BaseModel):
    """A stored prediction. ``summary`` (once ``succeeded``) holds the predicted figures in
    bytes and ``summary.prediction`` the verdict (``fits``, ``margin_bytes``), the method and
    its error bound; ``error`` says in one sentence why a ``failed`` or ``timed_out`` one has
    none."""

    model_config = ConfigDict(from_attributes=True, json_schema_extra={"examples": [_EXAMPLE_PREDICTION]})

    id: int
    status: Status = Field(description="succeeded, failed or timed_out")
    spec: dict[str, Any]
    target: str
    capacity_bytes: int | None = Field(description="the capacity given with the request, bytes; null: the target's")
    created_at: datetime
    finished_at: datetime | None
    elapsed_s: float | None = Field(description="seconds the prediction took")
    summary: SummaryPublic
    error: str | None


class PredictionsPublic(BaseModel):
    """Predictions (a page of them, or a batch's in the order of its targets) and how many
    match."""

    model_config = examples({"data": [_EXAMPLE_PREDICTION], "count": 1})

    data: list[PredictionPublic]
    count: int = Field(description="predictions matching the filters (before offset and limit)")
