"""Schemas of ``/api/plans``: a plan for a memory budget and its verdict."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ByteSize, ConfigDict, Field, StringConstraints, field_validator

from ckptlab.backend.schemas.common import OverheadPublic, examples
from ckptlab.backend.schemas.sweeps import RecommendationPublic
from ckptlab.spec.experiment import MAX_MEMORY_LIMIT_BYTES, find_unstorable
from ckptlab.spec.presets import EXAMPLE_SWEEP

__all__ = ["PlanCreate", "PlanPointPublic", "PredictedPointPublic", "PredictedOverheadPublic", "PlanPublic"]


def _budget_bounds(schema: dict[str, Any]) -> None:
    """The budget's bounds in the schema's integer branch (``ByteSize`` states ``minimum: 0``)."""
    for branch in schema["anyOf"]:
        if branch.get("type") == "integer":
            branch.update(minimum=1, maximum=MAX_MEMORY_LIMIT_BYTES)


class PlanCreate(BaseModel):
    """What to plan: a model and batch (an experiment spec without its checkpoint setting)
    and the memory budget, in bytes or with a unit (``"24 GiB"``, ``"1.5GB"``: pydantic's
    ``ByteSize``; GiB is 2**30, GB 10**9)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"base": EXAMPLE_SWEEP["base"], "budget": "2 MiB"}]},
    )

    name: Annotated[str, StringConstraints(min_length=1, max_length=200, strip_whitespace=True)] | None = None
    base: dict[str, Any] = Field(description="the experiment spec to plan for (fields as in ExperimentCreate)")
    budget: ByteSize = Field(
        description="the memory budget for the peak: bytes, or a size such as '24 GiB'",
        json_schema_extra=_budget_bounds,
    )
    compile_budgets: list[Annotated[float, Field(ge=0.0, le=1.0, strict=True)]] = Field(
        default_factory=lambda: [0.1, 0.5, 1.0],
        max_length=8,
        description=(
            "activation_memory_budget values of the compile_budget points (torch.compile's own budget; "
            "timed paired with the eager un-checkpointed copy like every point); the auto point then searches "
            "the compiler's budget too; [] leaves torch.compile out"
        ),
    )

    @field_validator("budget")
    @classmethod
    def _in_range(cls, value: ByteSize) -> ByteSize:
        if not 1 <= value <= MAX_MEMORY_LIMIT_BYTES:
            raise ValueError(f"budget must be between 1 byte and {MAX_MEMORY_LIMIT_BYTES} bytes (1 PiB)")
        return value

    @field_validator("name", "base")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        bad = find_unstorable(value)
        if bad is not None:
            raise ValueError(bad[2])
        return value


class PredictedOverheadPublic(BaseModel):
    """A predicted step-time overhead over the un-checkpointed step, %, with its interval
    where the planner gives one."""

    estimate_pct: float
    low_pct: float | None = None
    high_pct: float | None = None


class PredictedPointPublic(BaseModel):
    """One point of the front the planner predicted: the plan it would choose for a budget,
    its predicted peak and overhead."""

    model_config = ConfigDict(from_attributes=True)

    peak_bytes: int = Field(description="predicted peak allocated bytes")
    overhead_pct: float | None = Field(description="predicted step-time overhead over the un-checkpointed step, %")
    overhead_low_pct: float | None = None
    overhead_high_pct: float | None = None
    budget_bytes: int | None = Field(None, description="the budget this plan is the planner's answer for")


class PlanPointPublic(BaseModel):
    """One run of a plan: its label, strategy, peak and step time, and whether it fits."""

    model_config = ConfigDict(from_attributes=True)

    experiment_id: int
    label: str
    strategy: str
    status: str
    peak_allocated_bytes: int | None
    step_time_ms: float | None
    overhead_text: str | None = Field(description="step time against the baseline, with its 95% CI")
    fits: bool | None = Field(description="its measured peak is at or under the budget (null: not measured yet)")
    gradients_match: bool | None = Field(
        None, description="its gradients match the un-checkpointed step's (null: not verified, or the baseline)"
    )
    on_front: bool = Field(
        description="no other run with a paired overhead (the baseline's is 0) is both lower in it and in peak"
    )
    predicted_peak_bytes: int | None = Field(None, description="the auto run's predicted peak")
    paired_overhead: OverheadPublic | None = Field(
        None,
        description="step-time overhead over the un-checkpointed copy timed round by round in the same process "
        "(95% CI); null for the baseline and for runs timed unpaired (sharded ones, a copy that did not fit, "
        "torch.compile's stored before they were paired)",
    )
    overhead_clock: str | None = Field(None, description="the clock of the paired rounds: CPU time or wall time")
    predicted_overhead: PredictedOverheadPublic | None = Field(
        None, description="the auto run's overhead as its plan predicted it, where the planner gives one"
    )


class PlanPublic(BaseModel):
    """A plan's verdict: the budget, every point, the auto run's plan and the pick."""

    model_config = ConfigDict(from_attributes=True) | examples(
        {
            "sweep_id": 3,
            "name": "plan: mlp 8×64 under 2.0 MiB",
            "model": "mlp 8×64",
            "budget_bytes": 2097152,
            "finished": True,
            "points": [],
            "plan": {"segments": [[0, 4, True], [4, 8, False]], "checkpointed_blocks": [0, 1, 2, 3]},
            "recommendation": None,
        }
    )

    sweep_id: int = Field(description="the sweep that holds the plan's runs (GET /api/sweeps/{id})")
    name: str
    budget_bytes: int
    finished: bool
    points: list[PlanPointPublic]
    plan: dict[str, Any] | None = Field(
        description="the auto run's plan: segments [start, end, checkpointed] (a fourth item: a selective "
        "block's policy), ...",
    )
    recommendation: RecommendationPublic | None
    model: str = Field("", description="the model planned for, in one line (its kind's label: 'mlp 8×64')")
    predicted_front: list[PredictedPointPublic] = Field(
        default_factory=list,
        description="the front the planner predicted (plan.front), lowest peak first; [] when it gives none",
    )
