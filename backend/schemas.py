"""API schemas (``XCreate`` / ``XPublic``), kept apart from the ORM models.

``ExperimentCreate`` is the experiment spec itself (:class:`ckptlab.spec.ExperimentSpec`).
Every schema carries an example for ``/docs``.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, computed_field, field_validator

from ckptlab.db.queries import SERIES_METRICS
from ckptlab.spec import EXAMPLE_SPEC, ExperimentSpec

__all__ = [
    "ExperimentCreate",
    "ExperimentPublic",
    "ExperimentsPublic",
    "StepPublic",
    "StepsPublic",
    "Health",
    "Message",
    "Status",
    "Metric",
    "SeriesPoint",
    "SeriesPublic",
    "SweepCreate",
    "InvalidCombination",
    "ProgressPublic",
    "SweepExperimentPublic",
    "SweepPublic",
    "SweepSummaryPublic",
    "SweepsPublic",
    "SweepResultPublic",
    "SweepResultsPublic",
    "ChartName",
    "CHART_NAMES",
    "ChartPublic",
    "Format",
]

Status = Literal["queued", "running", "succeeded", "failed", "oom", "timed_out", "cancelled"]
Metric = Literal[SERIES_METRICS]  # type: ignore[valid-type]
Format = Literal["json", "csv"]
CHART_NAMES = ("memory_vs_segments", "time_vs_segments", "pareto", "correctness")
ChartName = Literal["memory_vs_segments", "time_vs_segments", "pareto", "correctness"]

_EXAMPLE_SUMMARY = {
    "device": "cpu",
    "activation_bytes": 1_310_720,
    "peak_allocated_bytes": 9_437_184,
    "step_time_ms": 12.5,
    "grad_max_abs_diff": 0.0,
    "gradients_match": True,
}
_EXAMPLE_EXPERIMENT = {
    "id": 1,
    "status": "succeeded",
    "spec": EXAMPLE_SPEC,
    "created_at": "2026-01-01T12:00:00Z",
    "started_at": "2026-01-01T12:00:01Z",
    "finished_at": "2026-01-01T12:00:09Z",
    "worker_id": "host:1234",
    "attempt": 1,
    "summary": _EXAMPLE_SUMMARY,
    "error": None,
    "warnings": [],
    "sweep_id": None,
}
_EXAMPLE_STEP = {
    "step": 1,
    "forward_ms": 3.1,
    "backward_ms": 6.2,
    "optimizer_ms": 1.0,
    "step_ms": 10.4,
    "allocated_bytes": 4_194_304,
    "peak_allocated_bytes": 9_437_184,
    "reserved_bytes": None,
    "loss": 2.31,
    "loss_nonfinite": None,
}


def _examples(*examples: Any) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": list(examples)})


class Message(BaseModel):
    """An error or notice: ``{"detail": "..."}``."""

    model_config = _examples({"detail": "experiment 7 not found"})

    detail: str


class ExperimentCreate(ExperimentSpec):
    """A new experiment: the experiment spec (unknown fields rejected)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [EXAMPLE_SPEC]})


class ExperimentPublic(BaseModel):
    """An experiment as the API shows it. ``summary`` is set once it has ``succeeded``."""

    model_config = ConfigDict(from_attributes=True, json_schema_extra={"examples": [_EXAMPLE_EXPERIMENT]})

    id: int
    status: Status
    spec: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    attempt: int
    summary: dict[str, Any] | None
    error: str | None
    warnings: list[str] | None = None
    sweep_id: int | None = None
    snapshot_path: str | None = Field(None, exclude=True)

    @computed_field(description="a CUDA memory snapshot is downloadable at /api/experiments/{id}/snapshot")
    @property
    def has_snapshot(self) -> bool:
        return bool(self.snapshot_path)


class ExperimentsPublic(BaseModel):
    """A page of experiments and the total count matching the query."""

    model_config = _examples({"data": [_EXAMPLE_EXPERIMENT], "count": 1})

    data: list[ExperimentPublic]
    count: int = Field(description="experiments matching the filters (before offset and limit)")


class StepPublic(BaseModel):
    """One step: times in ms, memory in bytes. A non-finite loss is ``loss: null`` with
    ``loss_nonfinite`` set to ``nan``, ``inf`` or ``-inf``."""

    model_config = ConfigDict(
        from_attributes=True, ser_json_inf_nan="null", json_schema_extra={"examples": [_EXAMPLE_STEP]}
    )

    step: int
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    step_ms: float
    allocated_bytes: int
    peak_allocated_bytes: int
    reserved_bytes: int | None
    loss: float | None
    loss_nonfinite: Literal["nan", "inf", "-inf"] | None
    extra: dict[str, Any] | None = Field(
        None,
        description="phase peaks (forward_peak_bytes, backward_peak_bytes, optimizer_peak_bytes), "
        "memory_at_forward_end and memory_at_peak by category (parameters, gradients, optimizer_state, "
        "activations, other; bytes), activation_bytes, recompute_peak_bytes, params_without_grad, "
        "nvml_used_bytes (CUDA)",
    )


class AttemptPublic(BaseModel):
    """One attempt (claim) of an experiment. A lost attempt's steps are kept for inspection
    (``GET /api/experiments/{id}/steps?attempt=N``) but are never the experiment's series."""

    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={"examples": [{"attempt": 1, "steps": 37, "lost": True, "current": False}]},
    )

    attempt: int
    steps: int = Field(description="steps stored for this attempt")
    lost: bool = Field(description="its worker was lost or it was requeued at shutdown")
    current: bool = Field(description="the experiment's current attempt")


class AttemptsPublic(BaseModel):
    """Every attempt of an experiment, oldest first."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "data": [
                        {"attempt": 1, "steps": 37, "lost": True, "current": False},
                        {"attempt": 2, "steps": 200, "lost": False, "current": True},
                    ]
                }
            ]
        }
    )

    data: list[AttemptPublic]


class StepsPublic(BaseModel):
    """The steps of an experiment's current attempt, by step."""

    model_config = _examples({"data": [_EXAMPLE_STEP], "count": 1})

    data: list[StepPublic]
    count: int


class Health(BaseModel):
    """Liveness: the API answers and the database is reachable."""

    model_config = _examples({"status": "ok", "database": "sqlite", "version": "0.1.0"})

    status: Literal["ok"] = "ok"
    database: str = Field(description="dialect of the connected database")
    version: str


# --- series ---------------------------------------------------------------------------------


class SeriesPoint(BaseModel):
    """One point of a series: the step and its value."""

    model_config = _examples({"step": 412, "value": 58.2})

    step: int
    value: float


class SeriesPublic(BaseModel):
    """A per-step metric, downsampled to at most ``max_points`` points (MinMaxLTTB: spikes
    survive; the global minimum and maximum are always included)."""

    model_config = _examples(
        {
            "experiment_id": 1,
            "attempt": 1,
            "metric": "step_ms",
            "total": 5,
            "skipped": 0,
            "downsampled": False,
            "x": [1, 2, 3, 4, 5],
            "y": [12.1, 10.4, 10.5, 10.3, 10.6],
            "min": {"step": 4, "value": 10.3},
            "max": {"step": 1, "value": 12.1},
        }
    )

    experiment_id: int
    attempt: int
    metric: Metric
    total: int = Field(description="steps with a finite value in the full series")
    skipped: int = Field(description="steps left out because their value is null or not finite")
    downsampled: bool = Field(description="whether x/y hold fewer points than the full series")
    x: list[int] = Field(description="step numbers, ascending")
    y: list[float] = Field(description="the metric at each step (ms or bytes; loss unitless)")
    min: SeriesPoint | None = Field(description="global minimum of the full series (null when empty)")
    max: SeriesPoint | None = Field(description="global maximum of the full series (null when empty)")


# --- sweeps ---------------------------------------------------------------------------------

AxisPath = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,5}$", max_length=200),
]
AxisValue = bool | int | float | Annotated[str, StringConstraints(max_length=200)] | None | dict[str, Any]

_EXAMPLE_SWEEP_CREATE = {
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


class SweepCreate(BaseModel):
    """A new sweep: a base spec crossed with axes of values at dotted spec paths.

    Every combination of axis values is one experiment (validated as an experiment spec;
    invalid combinations are reported in ``invalid``). A ``none`` baseline
    (``checkpoint.strategy: "none"``) is added for each combination of the axes outside
    ``checkpoint.``.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_EXAMPLE_SWEEP_CREATE]})

    name: Annotated[str, StringConstraints(min_length=1, max_length=200, strip_whitespace=True)]
    base: dict[str, Any] = Field(
        description="the experiment spec every run starts from (fields as in ExperimentCreate)",
        json_schema_extra={"examples": [_EXAMPLE_SWEEP_CREATE["base"]]},
    )
    axes: dict[AxisPath, Annotated[list[AxisValue], Field(min_length=1, max_length=64)]] = Field(
        min_length=1,
        max_length=8,
        description="dotted spec path -> values, e.g. {'checkpoint.segments': [1, 2, 4]}",
    )

    @field_validator("base", "axes")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        """JSON has no NaN or Infinity (Python's parser accepts them): reject them here."""
        bad = _non_finite_path(value)
        if bad is not None:
            raise ValueError(f"{bad or 'value'} is not a finite number (NaN and Infinity are not JSON)")
        return value


def _non_finite_path(value: Any, path: str = "") -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite_path(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


class ErrorDetail(BaseModel):
    """One validation error: where (``loc``) and what (``msg``)."""

    loc: list[str | int]
    msg: str
    type: str


class InvalidCombination(BaseModel):
    """A combination of axis values whose spec did not validate (no experiment queued)."""

    model_config = _examples(
        {
            "values": {"checkpoint.segments": 16, "amp": "off"},
            "baseline": False,
            "errors": [
                {
                    "loc": ["checkpoint", "segments"],
                    "msg": "segments (16) must not exceed model.depth (8)",
                    "type": "spec_constraint",
                }
            ],
        }
    )

    values: dict[str, Any]
    baseline: bool = Field(description="it was the 'none' baseline of its non-checkpoint values")
    errors: list[ErrorDetail]


class ProgressPublic(BaseModel):
    """How far a sweep has got: ``finished`` of ``total`` and the count in each status."""

    model_config = _examples(
        {
            "total": 10,
            "finished": 4,
            "counts": {
                "queued": 5,
                "running": 1,
                "succeeded": 4,
                "failed": 0,
                "oom": 0,
                "timed_out": 0,
                "cancelled": 0,
            },
        }
    )

    total: int
    finished: int
    counts: dict[Status, int]


class SweepExperimentPublic(BaseModel):
    """One experiment of a sweep: its axis values, its role and its summary."""

    model_config = _examples(
        {
            "id": 3,
            "status": "succeeded",
            "role": "run",
            "values": {"checkpoint.segments": 2, "checkpoint.preserve_rng_state": True, "amp": "off"},
            "label": "segments=2 rng=on amp=off",
            "baseline_id": 1,
            "attempt": 1,
            "summary": _EXAMPLE_SUMMARY,
            "error": None,
        }
    )

    id: int
    status: Status
    role: Literal["baseline", "run"]
    values: dict[str, Any] = Field(description="axis path -> this experiment's value")
    label: str
    baseline_id: int | None = Field(description="the 'none' baseline this run is compared with")
    attempt: int
    summary: dict[str, Any] | None
    error: str | None


class SweepSummaryPublic(BaseModel):
    """A sweep in a listing: its definition and progress."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    axes: dict[str, Any]
    created_at: datetime
    cancelled: bool
    progress: ProgressPublic


class SweepPublic(SweepSummaryPublic):
    """A sweep with every experiment's summary, its invalid combinations and its progress."""

    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "id": 1,
                    "name": "segments x rng x amp",
                    "axes": _EXAMPLE_SWEEP_CREATE["axes"],
                    "base": _EXAMPLE_SWEEP_CREATE["base"],
                    "created_at": "2026-01-01T12:00:00Z",
                    "cancelled": False,
                    "progress": ProgressPublic.model_config["json_schema_extra"]["examples"][0],
                    "invalid": [],
                    "experiments": [],
                }
            ]
        },
    )

    base: dict[str, Any]
    invalid: list[InvalidCombination]
    experiments: list[SweepExperimentPublic]


class SweepsPublic(BaseModel):
    """A page of sweeps, newest first, and the total count."""

    data: list[SweepSummaryPublic]
    count: int


class SweepResultPublic(BaseModel):
    """One row of a sweep's results: axis values and the numbers compared."""

    model_config = ConfigDict(from_attributes=True) | _examples(
        {
            "experiment_id": 3,
            "status": "succeeded",
            "role": "run",
            "label": "segments=2 rng=on amp=off",
            "values": {"checkpoint.segments": 2, "checkpoint.preserve_rng_state": True, "amp": "off"},
            "baseline_id": 1,
            "metrics": {
                "activation_bytes": 327680.0,
                "peak_allocated_bytes": 917504.0,
                "step_time_ms": 5.2,
                "overhead_pct": 18.0,
                "activation_saving_pct": 62.5,
                "grad_max_abs_diff": 0.0,
            },
            "gradients_match": True,
            "error": None,
        }
    )

    experiment_id: int
    status: Status
    role: Literal["baseline", "run"]
    label: str
    values: dict[str, Any]
    baseline_id: int | None
    metrics: dict[str, float | None] = Field(
        description="activation_bytes, peak_allocated_bytes, recompute_peak_bytes (bytes); step_time_ms, "
        "forward_ms, backward_ms, optimizer_ms (ms); grad_max_abs_diff, loss_diff, final_loss; "
        "overhead_pct (step time over the baseline's, %); activation_saving_pct (%). null when unknown."
    )
    gradients_match: bool | None
    error: str | None


class SweepResultsPublic(BaseModel):
    """A sweep's results: one row per experiment."""

    sweep_id: int
    axes: list[str]
    data: list[SweepResultPublic]


class ChartPublic(BaseModel):
    """A Plotly figure (``fig.to_plotly_json()``): pass ``data`` and ``layout`` to
    ``Plotly.newPlot``."""

    model_config = _examples(
        {
            "data": [
                {"type": "scatter", "name": "activation rng=on amp=off", "x": [2, 4], "y": [327680, 196608]},
                {"type": "scatter", "name": "segment law", "x": [1, 2, 4], "y": [524288, 327680, 196608]},
            ],
            "layout": {"title": {"text": "Memory against segments"}},
        }
    )

    data: list[dict[str, Any]]
    layout: dict[str, Any]
