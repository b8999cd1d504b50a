"""What every part of the experiment spec shares: strict parsing and errors located at the
field to fix. Imported by :mod:`ckptlab.spec.experiment` and :mod:`ckptlab.spec.hf_model`."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

__all__ = ["_Strict", "_field_error", "SpecInt", "spec_int", "integral"]


def integral(value: Any) -> Any:
    """An integral float (``8.0``, what many JSON encoders write for 8) as the int it is;
    anything else unchanged, so strict validation still refuses ``8.5``, ``"8"`` and
    ``true``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: An integer field of the spec: strict, but ``8.0`` is 8 (the JSON schema says ``integer``,
#: and JSON does not tell 8.0 from 8).
SpecInt = Annotated[int, BeforeValidator(integral)]


def spec_int(**bounds: int) -> Any:
    """:data:`SpecInt` within ``bounds`` (``ge``, ``gt``, ``le``, ``lt``), for an optional
    field: ``spec_int(ge=1) | None``. The bounds come before ``integral``'s validator, so the
    JSON schema states them as ``minimum`` / ``maximum`` / ``exclusiveMinimum`` in the
    field's ``anyOf`` (``Field(None, ge=1)`` on ``SpecInt | None`` puts them after it, where
    pydantic writes ``ge`` / ``le`` keys that JSON Schema does not know)."""
    return Annotated[int, Field(**bounds), BeforeValidator(integral)]


class _Strict(BaseModel):
    """Base for spec parts: unknown fields are rejected, so a misspelled option is an
    error instead of a silently ignored default."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


def _field_error(loc: tuple[str, ...], value: object, message: str) -> ValidationError:
    """A ValidationError located at ``loc``, for checks that involve several fields (so the
    API's 422 names the field to fix rather than the whole spec)."""
    return ValidationError.from_exception_data(
        "ExperimentSpec",
        [InitErrorDetails(type=PydanticCustomError("spec_constraint", message), loc=loc, input=value)],
    )
