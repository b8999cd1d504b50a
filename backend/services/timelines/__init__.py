"""A run's memory timeline for the API (issue 34): which steps have one, one step's live
bytes downsampled (:mod:`.views`) and who holds its peak. A package of its own, so that
``backend/services`` keeps a dozen modules."""

from ckptlab.backend.services.timelines.views import (
    DEFAULT_HOLDERS,
    DEFAULT_TIMELINE_POINTS,
    LoadedTimeline,
    NoTimeline,
    StepBeyondRun,
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
    "load_timeline",
    "peak_holders_view",
    "timeline_view",
]
