"""Routes for a run's memory timeline (issue 34): thin wrappers over
:mod:`ckptlab.backend.services.timelines`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.exceptions import RequestValidationError

from ckptlab.backend.deps import ExperimentId, SessionDep
from ckptlab.backend.schemas import Message, PeakHoldersPublic, TimelinePublic
from ckptlab.backend.schemas.timelines import MAX_HOLDERS, MAX_TIMELINE_POINTS
from ckptlab.backend.services import timelines
from ckptlab.db import store

router = APIRouter(prefix="/experiments", tags=["experiments"])

#: Largest step number (``steps.step`` is a 32-bit column).
MAX_STEP = 2**31 - 1

NO_TIMELINE = {
    404: {
        "model": Message,
        "description": "No experiment with this id, or no timeline to serve, saying why: the run did not succeed, "
        "it has none (a run stored before timelines, a CUDA or compiled run), or the step has none",
    }
}

StepQuery = Annotated[
    int | None,
    Query(
        ge=1,
        le=MAX_STEP,
        description="the step (default: the step that reached the run's peak); the first step and the peak step "
        "have a timeline; a step beyond the run's memory pass is a 422",
    ),
]


def _loaded(session, experiment_id: int, step: int | None) -> timelines.LoadedTimeline:
    """The step's timeline, or the 404 / 422 that says why there is none."""
    exp = store.get_experiment(session, experiment_id=experiment_id)
    if exp is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"experiment {experiment_id} not found")
    try:
        return timelines.load_timeline(session, exp, step)
    except timelines.StepBeyondRun as exc:
        raise RequestValidationError(
            [{"type": "value_error", "loc": ["query", "step"], "msg": str(exc), "input": step}]
        ) from None
    except timelines.NoTimeline as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc)) from None


@router.get(
    "/{experiment_id}/timeline",
    response_model=TimelinePublic,
    responses=NO_TIMELINE,
    summary="One step's memory timeline: every allocation and free, downsampled, by category and module",
)
def get_timeline(
    session: SessionDep,
    experiment_id: ExperimentId,
    step: StepQuery = None,
    max_points: Annotated[
        int, Query(ge=10, le=MAX_TIMELINE_POINTS, description="most points to return")
    ] = timelines.DEFAULT_TIMELINE_POINTS,
) -> TimelinePublic:
    """Live bytes after each allocation and free the live-tensor tracker counted in the step
    (CPU runs; the first step and the peak step are recorded), at most ``max_points`` of
    them picked by MinMaxLTTB with the peak's event always kept, exact; stacked by memory
    category, each point naming its event's module, op, bytes, whether its block was saved
    for backward and its checkpoint region; the forward / backward / optimizer spans and the
    recomputations. 404 naming why when there is none; 422 for a step beyond the run."""
    return timelines.timeline_view(_loaded(session, experiment_id, step), max_points)


@router.get(
    "/{experiment_id}/peak-holders",
    response_model=PeakHoldersPublic,
    responses=NO_TIMELINE,
    summary="Who holds a step's peak: live bytes by module, category and saved vs temporary",
)
def get_peak_holders(
    session: SessionDep,
    experiment_id: ExperimentId,
    step: StepQuery = None,
    top: Annotated[
        int, Query(ge=1, le=MAX_HOLDERS, description="groups to name, largest first")
    ] = timelines.DEFAULT_HOLDERS,
) -> PeakHoldersPublic:
    """The blocks alive at the step's peak grouped by (module, category, saved for backward or
    temporary), largest first: the ``top`` groups by name and the rest summed; together
    they are the peak to the byte. ``named_bytes``: what a module (or the batch, the loss,
    the optimizer) holds, ``unknown_bytes`` the rest. 404 naming why when the run has no
    timeline; 422 for a step beyond the run."""
    return timelines.peak_holders_view(_loaded(session, experiment_id, step), top)
