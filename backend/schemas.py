"""API schemas (``XCreate`` / ``XPublic``), kept apart from the ORM models.

``ExperimentCreate`` is the experiment spec itself (:class:`ckptlab.spec.ExperimentSpec`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ckptlab.spec import EXAMPLE_SPEC, ExperimentSpec

__all__ = ["ExperimentCreate", "ExperimentPublic", "ExperimentsPublic", "StepPublic", "StepsPublic", "Health"]


class ExperimentCreate(ExperimentSpec):
    """A new experiment: the experiment spec (unknown fields rejected)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [EXAMPLE_SPEC]})


class ExperimentPublic(BaseModel):
    """An experiment as the API shows it. ``summary`` is set once it has ``succeeded``."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    status: Literal["queued", "running", "succeeded", "failed", "oom", "timed_out", "cancelled"]
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


class ExperimentsPublic(BaseModel):
    """A page of experiments and the total count matching the query."""

    data: list[ExperimentPublic]
    count: int


class StepPublic(BaseModel):
    """One step: times in ms, memory in bytes. A non-finite loss is ``loss: null`` with
    ``loss_nonfinite`` set to ``nan``, ``inf`` or ``-inf``."""

    model_config = ConfigDict(from_attributes=True)

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


class StepsPublic(BaseModel):
    """The steps of an experiment's current attempt, by step."""

    data: list[StepPublic]
    count: int


class Health(BaseModel):
    """Liveness: the API answers and the database is reachable."""

    status: Literal["ok"] = "ok"
    database: str = Field(description="dialect of the connected database")
    version: str
