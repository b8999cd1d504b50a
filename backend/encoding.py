"""Responses that never fail on text: a stored or echoed string that is not valid UTF-8 (a
lone surrogate) is written with backslash escapes instead of turning the answer into a 500.

Input is rejected before it is stored (:func:`ckptlab.spec.experiment.find_unstorable`); this is the
second line, for rows stored before that check and for the 422 that echoes the bad input.
"""

from __future__ import annotations

from typing import Any

from fastapi import Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from ckptlab.summary import PER_STEP_FIELDS

__all__ = ["utf8_safe", "SafeJSONResponse", "json_without_per_step"]


def utf8_safe(value: Any) -> Any:
    """``value`` with every string (keys included) that UTF-8 cannot encode replaced by its
    backslash-escaped form (``"\\ud800"`` -> the six characters ``\\ud800``)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {utf8_safe(k): utf8_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [utf8_safe(v) for v in value]
    return value


class SafeJSONResponse(JSONResponse):
    """``JSONResponse`` that escapes unencodable text instead of raising (the app's default
    response class). The common case costs nothing extra: the content is walked only after
    an encode failed."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(utf8_safe(content))


def json_without_per_step(page: BaseModel, rows: str) -> Response:
    """``page`` as JSON with :data:`ckptlab.summary.PER_STEP_FIELDS` left out of the
    ``summary`` of every item of its list field ``rows`` (``?per_step=false`` on the lists).

    Written by pydantic in one call (``model_dump_json``: 4.2 ms against 11.8 ms for a dict
    then ``json.dumps`` on 100 experiments; docs/benchmarks.md); a string UTF-8 cannot
    encode (a lone surrogate in a stored row) makes pydantic refuse, and that page goes
    :class:`SafeJSONResponse`'s escaping way instead of a 500.
    """
    exclude = {rows: {"__all__": {"summary": set(PER_STEP_FIELDS)}}}
    try:
        return Response(page.model_dump_json(exclude=exclude), media_type="application/json")
    except PydanticSerializationError:
        return SafeJSONResponse(page.model_dump(mode="json", exclude=exclude))
