"""Schemas of experiments, their steps, attempts and per-step series."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from ckptlab.backend.schemas.common import (
    CORRUPT_DESCRIPTION,
    EXAMPLE_SUMMARY,
    CorruptPublic,
    OverheadPublic,
    SummaryPublic,
    examples,
)
from ckptlab.domain import SERIES_METRICS, Status
from ckptlab.spec.experiment import ExperimentSpec
from ckptlab.spec.presets import EXAMPLE_SPEC

__all__ = [
    "ExperimentCreate",
    "RunProgressPublic",
    "ExperimentPublic",
    "ExperimentsPublic",
    "StepPublic",
    "AttemptPublic",
    "AttemptsPublic",
    "StepsPublic",
    "Metric",
    "SeriesPoint",
    "SeriesPublic",
    "EventPublic",
    "EventsPublic",
    "RunLogPublic",
]

Metric = Literal[SERIES_METRICS]  # type: ignore[valid-type]

_EXAMPLE_EXPERIMENT = {
    "id": 1,
    "status": Status.SUCCEEDED,
    "spec": EXAMPLE_SPEC,
    "created_at": "2026-01-01T12:00:00Z",
    "started_at": "2026-01-01T12:00:01Z",
    "finished_at": "2026-01-01T12:00:09Z",
    "worker_id": "host:1234",
    "attempt": 1,
    "summary": EXAMPLE_SUMMARY,
    "error": None,
    "warnings": [],
    "sweep_id": None,
    "corrupt": None,
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


class ExperimentCreate(ExperimentSpec):
    """A new experiment: the experiment spec (unknown fields rejected)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [EXAMPLE_SPEC]})


class RunProgressPublic(BaseModel):
    """Where a queued or running experiment is (:class:`ckptlab.analysis.progress.RunProgress`):
    its place in the queue, or its pass and step, how far along its fixed total it is, and
    about how long it still needs (the steps left times their pass's measured step time)."""

    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                {
                    "queue_position": None,
                    "step": 12,
                    "total_steps": 25,
                    "done_steps": 14,
                    "run_pass": "timed",
                    "pass_step": 9,
                    "pass_steps": 20,
                    "pass_steps_at_most": False,
                    "timed_steps": 20,
                    "elapsed_s": 24.5,
                    "eta_s": 12.1,
                    "memory_left_s": None,
                    "text": "timed step 9 of 20, about 12 s left",
                }
            ]
        },
    )

    queue_position: int | None = Field(None, description="1: the next run a worker claims; null unless queued")
    step: int | None = Field(None, description="the last step recorded; null before the first")
    total_steps: int | None = Field(None, description="steps + timed_steps: fixed from the start")
    done_steps: int | None = Field(
        None, description="how far along total_steps (memory steps an early stop skipped count as done)"
    )
    run_pass: Literal["memory", "timed"] | None = Field(None, description="the pass of the last step")
    pass_step: int | None = Field(None, description="that pass's steps recorded so far")
    pass_steps: int | None = Field(None, description="that pass's steps in all (at most, see pass_steps_at_most)")
    pass_steps_at_most: bool = Field(False, description="the memory pass may stop early (memory_early_stop)")
    timed_steps: int | None = Field(None, description="the timing pass's steps")
    elapsed_s: float | None = Field(None, description="seconds since it started")
    eta_s: float | None = Field(
        None, description="about how many seconds remain; null while estimating (the memory pass, timed steps to come)"
    )
    memory_left_s: float | None = Field(None, description="during the memory pass: about how many seconds of it remain")
    text: str = Field(description="the same in words, as ckptlab run prints it")


class ExperimentPublic(BaseModel):
    """An experiment as the API shows it. ``summary`` is set once it has ``succeeded``. A
    stored row that does not read back whole is served all the same, ``corrupt`` saying what
    failed."""

    model_config = ConfigDict(from_attributes=True, json_schema_extra={"examples": [_EXAMPLE_EXPERIMENT]})

    id: int
    status: Status
    spec: dict[str, Any]
    created_at: datetime | None = Field(description="when it was submitted; null only when the stored value is corrupt")
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    attempt: int
    summary: SummaryPublic
    error: str | None = Field(
        description="why it did not succeed, in one sentence (the exception's type and message, no traceback: "
        "that is in GET /api/experiments/{id}/log)"
    )
    warnings: list[str] | None = None
    sweep_id: int | None = None
    snapshot_path: str | None = Field(None, exclude=True)
    progress: RunProgressPublic | None = Field(
        None, description="queued or running: where it is (only on GET /api/experiments/{id}); null otherwise"
    )
    corrupt: CorruptPublic | None = Field(None, description=CORRUPT_DESCRIPTION)

    @computed_field(description="a CUDA memory snapshot is downloadable at /api/experiments/{id}/snapshot")
    @property
    def has_snapshot(self) -> bool:
        return bool(self.snapshot_path)


class ExperimentsPublic(BaseModel):
    """A page of experiments and the total count matching the query."""

    model_config = examples({"data": [_EXAMPLE_EXPERIMENT], "count": 1})

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
    allocated_bytes: int | None = Field(description="null on a timing-pass step (not measured)")
    peak_allocated_bytes: int | None = Field(description="null on a timing-pass step (not measured)")
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


class ComparisonPublic(BaseModel):
    """An experiment against its ``none`` baseline: the step-time overhead with its 95% CI."""

    model_config = ConfigDict(from_attributes=True) | examples(
        {
            "experiment_id": 3,
            "is_baseline": False,
            "baseline_ids": [1, 5],
            "overhead": {"estimate_pct": 1.2, "low_pct": -2.0, "high_pct": 3.9, "measurable": False},
            "overhead_text": "no measurable difference (95% CI -2% to +4%)",
        }
    )

    experiment_id: int
    is_baseline: bool = Field(description="it is itself a 'none' run: nothing to compare")
    baseline_ids: list[int] = Field(
        description="succeeded baseline runs the overhead is taken against, their timed steps pooled "
        "(in a sweep: its group's baseline, run first and last; else the latest runs with the same spec "
        "but for checkpoint); empty when there is none"
    )
    overhead: OverheadPublic | None = Field(
        None,
        description="estimate_pct, low_pct, high_pct (bootstrap 95% CI of the ratio of medians of the timed "
        "steps) and measurable (the CI excludes 0 and the estimate is at least the 3% noise threshold)",
    )
    overhead_text: str | None = Field(
        None, description="the overhead in words; 'no measurable difference' when it is not measurable"
    )
    paired: bool = Field(
        False,
        description="the overhead comes from the run's own rounds with an un-checkpointed copy in its process "
        "(issue 19), not from the baseline runs (then listed for the memory figures only)",
    )
    baseline_refused: str | None = Field(
        None,
        description="why this server would refuse the run's baseline (its spec with strategy 'none', which "
        "the page's 'Run the baseline' submits), saying what to do instead (a ckptlab.profile run: profile "
        "the baseline in your own process); null when it would queue it",
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

    model_config = examples({"data": [_EXAMPLE_STEP], "count": 1})

    data: list[StepPublic]
    count: int


class SeriesPoint(BaseModel):
    """One point of a series: the step and its value."""

    model_config = examples({"step": 412, "value": 58.2})

    step: int
    value: float


class SeriesPublic(BaseModel):
    """A per-step metric over a step range (default: every stored step), downsampled to at
    most ``max_points`` points (MinMaxLTTB: spikes survive; the range's minimum and maximum
    are always included, exact)."""

    model_config = examples(
        {
            "experiment_id": 1,
            "attempt": 1,
            "metric": "step_ms",
            "step_min": None,
            "step_max": None,
            "total": 5,
            "skipped": 0,
            "downsampled": False,
            "resolution": 1,
            "x": [1, 2, 3, 4, 5],
            "y": [12.1, 10.4, 10.5, 10.3, 10.6],
            "min": {"step": 4, "value": 10.3},
            "max": {"step": 1, "value": 12.1},
        }
    )

    experiment_id: int
    attempt: int
    metric: Metric
    step_min: int | None = Field(None, description="first step of the range asked for (null: the first stored)")
    step_max: int | None = Field(None, description="last step of the range asked for (null: the last stored)")
    total: int = Field(description="steps of the range with a finite value")
    skipped: int = Field(description="steps of the range left out because their value is null or not finite")
    downsampled: bool = Field(description="whether x/y hold fewer points than the range has steps with a value")
    resolution: int = Field(
        1,
        description="steps per bucket the points were picked from: 1 when every step of the range was read, "
        "else the bucket size of the rollup level (256, 1024, ...) it was drawn from",
    )
    x: list[int] = Field(description="step numbers, ascending")
    y: list[float] = Field(description="the metric at each step (ms or bytes; loss unitless)")
    min: SeriesPoint | None = Field(description="minimum of the range, exact, with its step (null when empty)")
    max: SeriesPoint | None = Field(description="maximum of the range, exact, with its step (null when empty)")


class EventPublic(BaseModel):
    """One recorded status change (``experiment_events``)."""

    model_config = ConfigDict(from_attributes=True)

    at: datetime = Field(description="when (UTC; the database's clock on PostgreSQL)")
    status: Status = Field(description="the status the experiment moved to")
    attempt: int = Field(description="the attempt it belongs to (0 before the first claim)")
    worker_id: str | None = Field(description="the worker that claimed, finished or lost it")
    reason: str | None = Field(description="why, in words")


class EventsPublic(BaseModel):
    """Every status change of an experiment, oldest first."""

    model_config = examples(
        {
            "data": [
                {
                    "at": "2026-01-01T12:00:00Z",
                    "status": Status.QUEUED,
                    "attempt": 0,
                    "worker_id": None,
                    "reason": "submitted",
                },
                {
                    "at": "2026-01-01T12:00:01Z",
                    "status": Status.RUNNING,
                    "attempt": 1,
                    "worker_id": "a:1",
                    "reason": "claimed",
                },
                {
                    "at": "2026-01-01T12:01:02Z",
                    "status": Status.QUEUED,
                    "attempt": 1,
                    "worker_id": "a:1",
                    "reason": "worker a:1 lost (no heartbeat for 60 s); requeued",
                },
                {
                    "at": "2026-01-01T12:01:03Z",
                    "status": Status.RUNNING,
                    "attempt": 2,
                    "worker_id": "b:7",
                    "reason": "claimed",
                },
                {
                    "at": "2026-01-01T12:01:09Z",
                    "status": Status.SUCCEEDED,
                    "attempt": 2,
                    "worker_id": "b:7",
                    "reason": None,
                },
            ]
        }
    )

    data: list[EventPublic]


class RunLogPublic(BaseModel):
    """A run's log: the traceback its worker recorded when it failed, apart from the public
    one-sentence ``error``."""

    model_config = examples(
        {
            "experiment_id": 7,
            "attempt": 1,
            "status": Status.FAILED,
            "error": "RunError: RuntimeError: mat1 and mat2 shapes cannot be multiplied (16x64 and 32x64)",
            "log": 'Traceback (most recent call last):\n  File "run.py", line 150, in run_experiment\n    ...',
        }
    )

    experiment_id: int
    attempt: int = Field(description="the attempt the log belongs to (the experiment's current one)")
    status: Status
    error: str | None = Field(description="the public error, one sentence")
    log: str | None = Field(description="the traceback (Python's, with file paths); null when none was recorded")
