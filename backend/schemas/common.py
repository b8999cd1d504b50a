"""Schemas shared by every route: messages, health, the status vocabulary and examples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ckptlab.domain import Status
from ckptlab.summary import RunSummary

__all__ = ["Status", "Format", "Message", "Health", "ErrorDetail", "examples", "EXAMPLE_SUMMARY", "SummaryPublic"]

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
