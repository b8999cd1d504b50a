"""Schemas shared by every route: messages, health, the status vocabulary and examples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ckptlab.domain import Status
from ckptlab.summary import RunSummary

__all__ = [
    "Status",
    "Format",
    "Message",
    "Health",
    "ErrorDetail",
    "examples",
    "EXAMPLE_SUMMARY",
    "SummaryPublic",
    "CorruptPublic",
    "CORRUPT_DESCRIPTION",
    "OverheadPublic",
]

Format = Literal["json", "csv"]

EXAMPLE_SUMMARY = {
    "device": "cpu",
    "activation_bytes": 1_310_720,
    "peak_allocated_bytes": 9_437_184,
    "step_time_ms": 12.5,
    "grad_max_abs_diff": 0.0,
    "gradients_match": True,
}


def _read_summary(value: Any) -> Any:
    """A summary as stored (the JSON column's mapping) read with :meth:`RunSummary.load`, so a
    key of the wrong type reads as its default instead of failing the response."""
    return RunSummary.load(dict(value)) if isinstance(value, Mapping) else value


#: A run's summary in a response: typed (its OpenAPI schema lists every field), holding the
#: keys the run measured.
SummaryPublic = Annotated[RunSummary | None, BeforeValidator(_read_summary)]


def examples(*values: Any) -> ConfigDict:
    """A ``model_config`` whose JSON schema carries ``values`` as examples (for ``/docs``)."""
    return ConfigDict(json_schema_extra={"examples": list(values)})


class Message(BaseModel):
    """An error or notice: ``{"detail": "..."}``."""

    model_config = examples({"detail": "experiment 7 not found"})

    detail: str


class Health(BaseModel):
    """Liveness: the API answers and the database is reachable."""

    model_config = examples({"status": "ok", "database": "sqlite", "version": "0.1.0"})

    status: Literal["ok"] = "ok"
    database: str = Field(description="dialect of the connected database")
    version: str


class ErrorDetail(BaseModel):
    """One validation error: where (``loc``) and what (``msg``)."""

    loc: list[str | int]
    msg: str
    type: str


class CorruptPublic(BaseModel):
    """What of a stored row could not be read (:class:`ckptlab.db.corrupt.Corruption`): the
    row is served with stand-ins for those fields (null, or an empty value) and the rest as
    stored."""

    model_config = ConfigDict(from_attributes=True) | examples(
        {"fields": ["summary"], "reason": "summary: not valid JSON: Expecting value: line 1 column 1 (char 0)"}
    )

    fields: list[str] = Field(description="the stored fields that failed to read, or to validate")
    reason: str = Field(description="why, field by field: 'field: reason; field: reason'")


#: The ``corrupt`` field's description, shared by experiments and sweeps.
CORRUPT_DESCRIPTION = (
    "null when the stored row reads back whole; else which fields could not be read (invalid JSON, a date "
    "or integer that is not one, a value of the wrong shape: served as null or an empty value) or do not "
    "validate (a spec or summary: served as stored, a summary's bad keys left out), and why. "
    "`ckptlab db check` lists such rows."
)


class OverheadPublic(BaseModel):
    """A step-time overhead against the baseline with its 95% CI
    (:class:`ckptlab.analysis.stats.RatioInterval`, as ``as_dict`` gives it)."""

    model_config = examples({"estimate_pct": 31.2, "low_pct": 29.0, "high_pct": 33.5, "measurable": True, "rounds": 20})

    estimate_pct: float = Field(description="100 x (median ratio - 1): positive is slower")
    low_pct: float = Field(description="95% CI, low end (bootstrap)")
    high_pct: float = Field(description="95% CI, high end (bootstrap)")
    threshold_pct: float | None = Field(None, description="the noise threshold the estimate must reach")
    rounds: int | None = Field(None, description="samples behind it (the fewer of two sets; paired: rounds)")
    not_comparable: str | None = Field(
        None, description="why two separate runs were not compared (a busy host, different CPU heaps), or null"
    )
    measurable: bool = Field(
        description="a difference to report: comparable, at least 5 rounds, the CI excludes 0 and the estimate "
        "reaches the noise threshold"
    )
    unmeasured_why: str | None = Field(
        None,
        description="why it is not measurable ('too few rounds (3; at least 5)', 'the 95% CI contains 0', "
        "'below the noise threshold (±10%)', 'not comparable'); null when measurable",
    )
