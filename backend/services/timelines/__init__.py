"""A run's (or a prediction's) memory timeline for the API (issue 34): which steps have one,
one step's live bytes downsampled (:mod:`.views`), who holds its peak, and the predictions
of a run's spec that have one (:mod:`.matching`). A package of its own, so that
``backend/services`` keeps a dozen modules."""

from ckptlab.backend.services.timelines.matching import predictions_of
from ckptlab.backend.services.timelines.views import (
    DEFAULT_HOLDERS,
    DEFAULT_TIMELINE_POINTS,
    LoadedTimeline,
    NoTimeline,
    StepBeyondRun,
    load_prediction_timeline,
    load_timeline,
    peak_holders_view,
    timeline_view,
)

__all__ = [
    "DEFAULT_HOLDERS",
    "DEFAULT_TIMELINE_POINTS",
    "LoadedTimeline",
    "NoTimeline",
    "StepBeyondRun",
    "load_prediction_timeline",
    "load_timeline",
    "peak_holders_view",
    "predictions_of",
    "timeline_view",
]
