"""Which prediction is of a run's spec (issue 34: predicted and measured timelines together).

A run and a prediction match when their specs, as stored (``model_dump(mode="json")`` of a
validated :class:`~ckptlab.spec.experiment.ExperimentSpec`), are the same JSON but for the
fields a prediction does not read (:data:`NOT_PREDICTED_FIELDS`: where and how long the run
runs, what it checks beside the memory, and its memory limit, which a prediction takes as
the capacity of its verdict, not a cause of failure). The target is not part of it: a run on
the CPU matches its predictions for ``cpu`` and for a GPU alike.

Example usage::

    prediction_key(experiment.spec) == prediction_key(prediction.spec)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["NOT_PREDICTED_FIELDS", "prediction_key"]

#: Top-level spec fields a prediction does not read (``ckptlab.worker.predict.predict_run``):
#: a run and a prediction whose specs differ only in these match.
NOT_PREDICTED_FIELDS = frozenset(
    {
        "device",
        "timed_steps",
        "paired_timing",
        "verify_gradients",
        "memory_snapshot",
        "memory_early_stop",
        "memory_limit_bytes",
        "timeout_s",
    }
)


def prediction_key(spec: Mapping[str, Any]) -> str:
    """The text two specs (as stored: JSON objects) share exactly when a prediction of one is
    a prediction of the other: the spec without :data:`NOT_PREDICTED_FIELDS`, as canonical
    JSON (keys sorted). Specs are compared as stored: store validated dumps on both sides,
    as the store does, so that defaults are spelled out."""
    kept = {k: v for k, v in spec.items() if k not in NOT_PREDICTED_FIELDS}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
