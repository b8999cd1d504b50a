"""Responses that never fail on text: a stored or echoed string that is not valid UTF-8 (a
lone surrogate) is written with backslash escapes instead of turning the answer into a 500.

Input is rejected before it is stored (:func:`ckptlab.spec.experiment.find_unstorable`); this is the
second line, for rows stored before that check and for the 422 that echoes the bad input.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

__all__ = ["utf8_safe", "SafeJSONResponse"]


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
