"""A memory timeline (:mod:`ckptlab.analysis.timeline`) as it is stored and as it travels:
the row of ``memory_timelines`` (a run's) or ``prediction_timelines`` (a prediction's) but
its key (:func:`timeline_row`: the blob and the figures a listing reads without opening it),
and that row as JSON (:func:`row_to_json`, :func:`row_from_json`: the blob base64), as the
prediction process (``python -m ckptlab.worker.predict``) writes it on its answer line for
the backend, which never imports torch, to store.

Example usage::

    row = timeline_row(tl, is_peak=True)
    assert row_from_json(json.loads(json.dumps(row_to_json(row)))) == row
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from ckptlab.analysis.timeline import _MAGIC, StepTimeline, TimelineFormatError, encode

__all__ = ["ROW_FIGURES", "timeline_row", "row_to_json", "row_from_json"]

#: The integer figures of a stored timeline (bytes, event indices), beside ``is_peak`` and ``data``.
ROW_FIGURES = ("step", "n_events", "baseline_bytes", "peak_bytes", "peak_index")
#: Bounds of the figures: a 64-bit byte count, a 32-bit step and event count.
_LIMITS = {"step": (1, 2**31 - 1), "n_events": (0, 2**31 - 1), "peak_index": (-1, 2**31 - 1)}
_BYTES_LIMITS = (0, 2**63 - 1)


def timeline_row(tl: StepTimeline, is_peak: bool) -> dict[str, Any]:
    """The stored form of ``tl``: ``step``, ``is_peak`` (the step whose peak is the run's or
    the prediction's), ``n_events``, ``baseline_bytes`` and ``peak_bytes`` (bytes),
    ``peak_index`` (event index, -1: the step's start) and ``data`` (the blob,
    :func:`ckptlab.analysis.timeline.encode`).

    Raises:
        TimelineFormatError: the timeline's columns do not fit together.
    """
    peak_bytes, peak_index = tl.peak()
    return {
        "step": tl.step,
        "is_peak": is_peak,
        "n_events": tl.n_events,
        "baseline_bytes": tl.baseline_bytes,
        "peak_bytes": peak_bytes,
        "peak_index": peak_index,
        "data": encode(tl),
    }


def row_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` (:func:`timeline_row`) as JSON: the same fields, ``data`` base64 (standard
    alphabet, padded)."""
    return {**row, "data": base64.b64encode(row["data"]).decode("ascii")}


def row_from_json(value: Any) -> dict[str, Any]:
    """The row ``value`` (:func:`row_to_json`'s JSON) states, checked: each figure a whole
    number in range, ``is_peak`` a boolean, ``data`` base64 of a timeline blob. The blob is
    not decoded (its reader says when it does not read back).

    Raises:
        TimelineFormatError: naming the first field that is missing or wrong.
    """
    if not isinstance(value, Mapping):
        raise TimelineFormatError("a memory timeline row must be a JSON object")
    row: dict[str, Any] = {}
    for name in ROW_FIGURES:
        figure = value.get(name)
        low, high = _LIMITS.get(name, _BYTES_LIMITS)
        if isinstance(figure, bool) or not isinstance(figure, int) or not low <= figure <= high:
            raise TimelineFormatError(f"a memory timeline row's {name} must be a whole number in {low}..{high}")
        row[name] = figure
    if not isinstance(value.get("is_peak"), bool):
        raise TimelineFormatError("a memory timeline row's is_peak must be true or false")
    row["is_peak"] = value["is_peak"]
    try:
        data = base64.b64decode(value.get("data"), validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise TimelineFormatError("a memory timeline row's data must be base64") from None
    if not data.startswith(_MAGIC):
        raise TimelineFormatError("a memory timeline row's data is not a stored memory timeline")
    row["data"] = data
    return row
