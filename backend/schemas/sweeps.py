"""Schemas of sweeps: the request, its plan (dry run), progress, results and charts."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from ckptlab.analysis.stats import SEPARATE_RUNS
from ckptlab.backend.schemas.common import (
    CORRUPT_DESCRIPTION,
    EXAMPLE_SUMMARY,
    CorruptPublic,
    ErrorDetail,
    OverheadPublic,
    SummaryPublic,
    examples,
)
from ckptlab.domain import Status
from ckptlab.spec.experiment import find_unstorable
from ckptlab.spec.presets import EXAMPLE_SWEEP
from ckptlab.spec.sweeps import axis_paths
from ckptlab.strategies import BASELINE

__all__ = [
    "SweepCreate",
    "InvalidCombination",
    "ProgressPublic",
    "SweepExperimentPublic",
    "SweepPublic",
    "SweepSummaryPublic",
    "SweepsPublic",
    "SweepResultPublic",
    "SweepResultsPublic",
    "PlannedRunPublic",
    "SweepPlanPublic",
    "ChartName",
    "CHART_NAMES",
    "ChartPublic",
    "ExcludedRow",
    "RecommendationPublic",
]

CHART_NAMES = ("memory_vs_segments", "time_vs_segments", "pareto", "correctness", "memory_per_rank")
ChartName = Literal["memory_vs_segments", "time_vs_segments", "pareto", "correctness", "memory_per_rank"]

#: A dotted spec path such as ``checkpoint.segments``.
AXIS_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,5}$"
AxisPath = Annotated[
    str,
    StringConstraints(pattern=AXIS_PATTERN, max_length=200),
]
AxisValue = bool | int | float | Annotated[str, StringConstraints(max_length=200)] | None | dict[str, Any]


def _axis_names(schema: dict[str, Any]) -> None:
    """The axes' names as JSON Schema: one of the spec's field paths
    (:func:`ckptlab.spec.sweeps.axis_paths`, read at schema time so that a kind registered
    after import is in it) or a dotted key below a free-form one, within ``AXIS_PATTERN``'s
    six parts."""
    paths, free = axis_paths()
    below = [rf"^{re.escape(p)}(\.[A-Za-z_][A-Za-z0-9_]*){{1,{5 - p.count('.')}}}$" for p in free]
    names = [{"enum": paths}, *({"pattern": b} for b in below)]
    schema["propertyNames"] = {"anyOf": names, "minLength": 1, "maxLength": 200}


class SweepCreate(BaseModel):
    """A new sweep: a base spec crossed with axes of values at dotted spec paths.

    Every combination of axis values is one experiment (validated as an experiment spec;
    invalid combinations are reported in ``invalid``). A ``none`` baseline
    (``checkpoint.strategy: "none"``) is added for each combination of the axes outside
    ``checkpoint.``.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [EXAMPLE_SWEEP]})

    name: Annotated[str, StringConstraints(min_length=1, max_length=200, strip_whitespace=True)]
    base: dict[str, Any] = Field(
        description="the experiment spec every run starts from (fields as in ExperimentCreate)",
        json_schema_extra={"examples": [EXAMPLE_SWEEP["base"]]},
    )
    axes: dict[AxisPath, Annotated[list[AxisValue], Field(min_length=1, max_length=64)]] = Field(
        min_length=1,
        max_length=8,
        description="dotted spec path -> values, e.g. {'checkpoint.segments': [1, 2, 4]}",
        # Keys are the spec's field paths: say so in the schema, not only in the server.
        json_schema_extra=_axis_names,
    )

    @field_validator("name", "base", "axes")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        """JSON has no NaN or Infinity (Python's parser accepts them) and text must be valid
        UTF-8 (no lone surrogate): reject both here, before anything is stored."""
        bad = find_unstorable(value)
        if bad is not None:
            loc, _value, message = bad
            where = ".".join(str(p) for p in loc)
            raise ValueError(f"{where + ': ' if where else ''}{message}")
        return value


class InvalidCombination(BaseModel):
    """A combination of axis values whose spec did not validate (no experiment queued)."""

    model_config = examples(
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
    """How far a sweep has got: ``finished`` of ``total``, the count in each status, and
    about how long the rest takes (:func:`ckptlab.analysis.progress.sweep_eta`)."""

    model_config = examples(
        {
            "total": 10,
            "finished": 4,
            "counts": dict(zip(Status, (5, 1, 4, 0, 0, 0, 0), strict=True)),
            "elapsed_s": 120.0,
            "eta_s": 180.0,
            "eta_text": "about 3 min left",
        }
    )

    total: int
    finished: int
    counts: dict[Status, int]
    elapsed_s: float | None = Field(None, description="seconds since the first run started; null before")
    eta_s: float | None = Field(
        None, description="about how many seconds remain: elapsed x unfinished / finished; null before a run finished"
    )
    eta_text: str = Field("", description="the estimate in words; empty when done or before a run started")


class SweepExperimentPublic(BaseModel):
    """One experiment of a sweep: its axis values, its role and its summary."""

    model_config = examples(
        {
            "id": 3,
            "status": Status.SUCCEEDED,
            "role": "run",
            "values": {"checkpoint.segments": 2, "checkpoint.preserve_rng_state": True, "amp": "off"},
            "label": "segments=2 rng=on amp=off",
            "baseline_id": 1,
            "attempt": 1,
            "summary": EXAMPLE_SUMMARY,
            "error": None,
        }
    )

    id: int
    status: Status
    role: Literal["baseline", "run"]
    values: dict[str, Any] = Field(description="axis path -> this experiment's value")
    label: str
    baseline_id: int | None = Field(description="the 'none' baseline this run is compared with")
    repeat_of: int | None = Field(None, description="for a baseline's second run: the first run's id")
    attempt: int
    summary: SummaryPublic
    error: str | None


class SweepSummaryPublic(BaseModel):
    """A sweep in a listing: its definition and progress. A stored row that does not read back
    whole is served all the same, ``corrupt`` saying what failed."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    axes: dict[str, Any]
    created_at: datetime | None = Field(description="when it was created; null only when the stored value is corrupt")
    cancelled: bool
    progress: ProgressPublic
    corrupt: CorruptPublic | None = Field(None, description=CORRUPT_DESCRIPTION)


class SweepPublic(SweepSummaryPublic):
    """A sweep with every experiment's summary, its invalid combinations and its progress."""

    model_config = ConfigDict(
        from_attributes=True,
        json_schema_extra={
            "examples": [
                dict(
                    id=1,
                    name="segments x rng x amp",
                    axes=EXAMPLE_SWEEP["axes"],
                    base=EXAMPLE_SWEEP["base"],
                    created_at="2026-01-01T12:00:00Z",
                    cancelled=False,
                    progress=ProgressPublic.model_config["json_schema_extra"]["examples"][0],
                    invalid=[],
                    experiments=[],
                )
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


#: What the results' millisecond figures are (``SweepResultsPublic.raw_times``).
RAW_TIMES_NOTE = (
    f"step_time_ms, forward_ms, backward_ms and optimizer_ms are each run's own medians: {SEPARATE_RUNS}. "
    "Compare settings by overhead (against an un-checkpointed copy timed in the same process, where paired) "
    "and rank"
)


class SweepResultPublic(BaseModel):
    """One row of a sweep's results: axis values and the numbers compared."""

    model_config = ConfigDict(from_attributes=True) | examples(
        {
            "experiment_id": 3,
            "status": Status.SUCCEEDED,
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
    repeat_of: int | None = Field(
        None, description="for a baseline's second run: the first run's experiment id; its overhead is the drift"
    )
    metrics: dict[str, float | None] = Field(
        description="activation_bytes, peak_allocated_bytes, recompute_peak_bytes (bytes); step_time_ms, "
        f"forward_ms, backward_ms, optimizer_ms (ms, medians of this run's own steps: {SEPARATE_RUNS}); "
        "grad_max_abs_diff, loss_diff, final_loss; "
        "overhead_pct (step time over the baseline's, %) with overhead_low_pct / overhead_high_pct (its 95% CI); "
        "activation_saving_pct, peak_saving_pct (%); activation_bytes_at_peak, reference_activation_bytes. "
        "null when unknown."
    )
    gradients_match: bool | None
    error: str | None
    strategy: str = Field(BASELINE, description="the spec's checkpoint.strategy")
    overhead: OverheadPublic | None = Field(
        None,
        description="step-time overhead against the baseline: estimate_pct, low_pct and high_pct (bootstrap "
        "95% CI of the ratio of medians of the timed steps) and measurable (the CI excludes 0 and the "
        "estimate is at least the 3% noise threshold)",
    )
    overhead_text: str | None = Field(
        None, description="the overhead in words; 'no measurable difference' when it is not measurable"
    )
    findings: list[str] = Field(default_factory=list, description="codes of settings that do nothing or backfire")
    peak_phase: str | None = Field(None, description="forward, backward or optimizer")
    peak_explanation: str | None = Field(None, description="where the peak is and what could shrink it")
    rank: int | None = Field(
        None,
        description="its place among the candidates by overhead, 1 = fastest (the recommendation's ranking); "
        "null for a run that is no candidate (not succeeded, gradients differ, a baseline's second run)",
    )


class SweepResultsPublic(BaseModel):
    """A sweep's results: one row per experiment."""

    sweep_id: int
    axes: list[str]
    data: list[SweepResultPublic]
    raw_times: str = Field(
        RAW_TIMES_NOTE, description="what the metrics' millisecond figures are, and what to compare instead"
    )


class ChartPublic(BaseModel):
    """A Plotly figure (``fig.to_plotly_json()``): pass ``data`` and ``layout`` to
    ``Plotly.newPlot``."""

    model_config = examples(
        {
            "data": [
                {"type": "scatter", "name": "activation rng=on amp=off", "x": [2, 4], "y": [327680, 196608]},
                {"type": "scatter", "name": "expected", "x": [1, 2, 4], "y": [524288, 327680, 196608]},
            ],
            "layout": {"title": {"text": "Memory against segments"}},
        }
    )

    data: list[dict[str, Any]]
    layout: dict[str, Any]


class PlannedRunPublic(BaseModel):
    """One experiment a sweep would queue (from a dry run)."""

    values: dict[str, Any] = Field(description="axis path -> this run's value")
    label: str
    baseline: bool = Field(description="it is the 'none' baseline of its non-checkpoint values")
    repeat: bool = Field(False, description="a baseline's second run, queued last so that drift shows")
    spec: dict[str, Any] = Field(description="the validated spec, defaults filled in")


class SweepPlanPublic(BaseModel):
    """What ``POST /api/sweeps`` would queue, from ``?dry_run=true``: nothing is stored."""

    model_config = examples(
        {
            "combinations": 4,
            "baselines": 1,
            "repeats": 1,
            "total": 6,
            "duplicates": 0,
            "runs": [
                {
                    "values": {"checkpoint.strategy": BASELINE},
                    "label": f"strategy={BASELINE}",
                    "baseline": True,
                    "spec": {"model": EXAMPLE_SWEEP["base"]["model"]},
                }
            ],
            "invalid": [],
        }
    )

    combinations: int = Field(description="size of the product of the axes")
    baselines: int = Field(description="'none' baselines: one per combination of the non-checkpoint axes")
    repeats: int = Field(0, description="baselines queued a second time, after the runs, so that drift shows")
    total: int = Field(description="experiments the sweep would queue (runs and baselines, duplicates once)")
    duplicates: int = Field(description="valid combinations whose spec equals an earlier one (queued once)")
    runs: list[PlannedRunPublic]
    invalid: list[InvalidCombination]


class ExcludedRow(BaseModel):
    """A row the recommendation left out, and why."""

    experiment_id: int
    label: str
    why: str


class SmallestWithin(BaseModel):
    """The lowest-peak setting whose overhead against its own baseline is at most
    ``within_pct`` % (its estimate; a baseline's is 0), with that overhead and its 95% CI."""

    experiment_id: int
    label: str
    within_pct: float
    overhead_pct: float | None = Field(None, description="its overhead against its baseline, %: the estimate")
    overhead_low_pct: float | None = Field(None, description="95% CI, low end, %")
    overhead_high_pct: float | None = Field(None, description="95% CI, high end, %")
    overhead_text: str | None = Field(None, description="the overhead in words, with its CI and how it was timed")


class RecommendationPublic(BaseModel):
    """Which setting of a sweep to use, and why (``GET /api/sweeps/{id}/recommendation``)."""

    model_config = ConfigDict(from_attributes=True) | examples(
        {
            "experiment_id": 4,
            "label": "segments=4",
            "reason": "the lowest peak with a real saving: 9.0 MiB (38% below its baseline), overhead +21% "
            "(95% CI +15% to +27%; CPU time of rounds paired with none in one process); of peaks within 1% of "
            "it, the fastest",
            "budget_bytes": None,
            "considered": [1, 2, 3, 4],
            "excluded": [{"experiment_id": 2, "label": "segments=1", "why": "no real memory saving"}],
            "ranking": [1, 2, 4, 3],
        }
    )

    experiment_id: int | None = Field(description="the recommended experiment; null when none qualifies")
    label: str | None
    reason: str = Field(description="the decision in plain words")
    budget_bytes: int | None
    considered: list[int] = Field(description="candidate experiment ids (succeeded, gradients not differing)")
    excluded: list[ExcludedRow]
    fitting: list[int] | None = Field(
        None, description="with a budget: the candidates (baselines, real savings) whose peak fits it"
    )
    smallest_within: SmallestWithin | None = Field(
        None,
        description="with within_pct: the lowest peak among the choices (fitting the budget, if any) whose "
        "overhead against their own baseline is at most within_pct (its estimate); null when none is",
    )
    ranking: list[int] = Field(
        default_factory=list,
        description="the candidates' ids, fastest first: by the high end of their overhead's 95% CI (paired "
        "against an un-checkpointed copy where timed so), then lower peak, then the simpler setting. The "
        "budget's pick is the first that fits; the page sorts its table's overhead column by it",
    )
